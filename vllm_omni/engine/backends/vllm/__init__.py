"""Generic vLLM plumbing: AsyncLLM setup, devices, sampling conversion, runner-extension workers, tensor transport."""
