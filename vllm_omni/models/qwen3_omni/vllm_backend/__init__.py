"""Qwen3-Omni stages on vLLM: engine drivers, the talker model, runner extensions and their workers."""
