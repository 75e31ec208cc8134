"""Model families, each registered by checkpoint architecture (`registry.py`): how a request
becomes the first stage's prompt, how outputs route between its stages, its stage programs
per backend, its vLLM model registrations and its tiny-checkpoint builder."""
