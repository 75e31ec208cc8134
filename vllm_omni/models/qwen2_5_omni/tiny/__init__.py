"""Tiny random-weight Qwen2.5-Omni checkpoints for CPU development and tests."""
