"""Qwen3-Omni stage programs on the torch backend (step workers in this process)."""
