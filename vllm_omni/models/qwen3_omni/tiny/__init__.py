"""Tiny random-weight Qwen3-Omni checkpoints for CPU development and tests."""
