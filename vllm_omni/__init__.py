"""vllm-omni: a realtime serving stack for omni models."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy, so `import vllm_omni` (and the CLI's --help) does not load torch.
    if name in ("Omni", "AsyncOmni", "OmniResult"):
        from vllm_omni import offline

        return getattr(offline, name)
    raise AttributeError(f"module 'vllm_omni' has no attribute {name!r}")
