"""The `vllm-omni` command line."""
