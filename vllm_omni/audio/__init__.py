"""PCM16 helpers, resampling, streaming log-mel, Silero VAD. A leaf: imports nothing else of
vllm_omni."""
