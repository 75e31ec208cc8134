"""Wire types (pydantic) for the realtime protocol: client and server events, session config,
error codes. A leaf: imports nothing else of vllm_omni."""
