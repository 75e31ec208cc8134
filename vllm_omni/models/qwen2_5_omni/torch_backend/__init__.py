"""Qwen2.5-Omni's stages on the torch backend (transformers' modules, one cache per request)."""
