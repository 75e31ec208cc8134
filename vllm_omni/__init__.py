"""vllm-omni: a realtime serving stack for omni models."""

__version__ = "0.1.0"
