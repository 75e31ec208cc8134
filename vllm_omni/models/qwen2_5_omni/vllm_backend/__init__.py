"""Qwen2.5-Omni on vLLM: the thinker engine (the talker and token2wav run on torch)."""
