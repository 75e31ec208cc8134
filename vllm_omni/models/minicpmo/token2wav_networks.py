"""Token2wav's networks, loaded from a checkpoint's `assets/token2wav/` folder (docs/minicpmo.md,
"Token2wav").

The classes are the published ones (the `step-audio2` package's `cosyvoice2` and
`flashcosyvoice` modules): the flow model (conformer encoder with 3 look-ahead codes, then a
DiT estimator solved by flow matching) and the HiFT vocoder. This module only builds them:

* `flow.yaml` is read with a restricted YAML loader that knows the four `!new:` classes it
  names, nothing else;
* HiFT has no config in the real assets (its constructor defaults are the 24 kHz model); a
  `hift.yaml` of constructor arguments, when present, overrides them (the tiny checkpoint's);
* the flow-matching decoder's noise is drawn from a seeded generator, and its streaming
  scratch buffers are sized to the config and grown on demand instead of the library's fixed
  2.1 GB.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

FLOW_CONFIG, FLOW_WEIGHTS, HIFT_WEIGHTS, HIFT_CONFIG = "flow.yaml", "flow.pt", "hift.pt", "hift.yaml"
NOISE_FRAMES = 50 * 600  # the decoder's noise covers 600 s of mel frames, as the library's does
HIFT_KEY_PREFIX = "generator."  # hift.pt's keys carry the training wrapper's prefix


def _import_library() -> dict[str, type]:
    """The network classes by their flow.yaml names. Importing the encoder module sets two of
    torch._dynamo's process-wide options; they are put back so other models' compilation is
    unaffected."""
    import torch._dynamo

    saved = (torch._dynamo.config.suppress_errors, torch._dynamo.config.cache_size_limit)
    try:
        from cosyvoice2.flow.decoder_dit import DiT
        from cosyvoice2.flow.flow import CausalMaskedDiffWithXvec
        from cosyvoice2.flow.flow_matching import CausalConditionalCFM
        from cosyvoice2.transformer.upsample_encoder_v2 import UpsampleConformerEncoderV2
    finally:
        torch._dynamo.config.suppress_errors, torch._dynamo.config.cache_size_limit = saved
    classes = (CausalMaskedDiffWithXvec, UpsampleConformerEncoderV2, CausalConditionalCFM, DiT)
    return {f"{cls.__module__}.{cls.__name__}": cls for cls in classes}


def read_flow_yaml(path: Path) -> dict[str, Any]:
    """flow.yaml with its `!new:module.Class` nodes built (keyword arguments only)."""
    classes = _import_library()

    class Loader(yaml.SafeLoader):
        pass

    def construct(loader: yaml.SafeLoader, name: str, node: yaml.Node) -> Any:
        if name not in classes:
            raise ValueError(f"{path}: unknown class !new:{name}")
        kwargs = loader.construct_mapping(node, deep=True)
        if name.endswith(".CausalConditionalCFM"):
            # Its own tensors are the noise and the scratch buffers, all replaced after
            # loading: build them on the meta device rather than allocate 2.1 GB.
            with torch.device("meta"):
                return classes[name](**kwargs)
        return classes[name](**kwargs)

    Loader.add_multi_constructor("!new:", construct)
    with open(path) as f:
        return yaml.load(f, Loader=Loader)  # a SafeLoader that knows four classes


def hift_generator(config: dict[str, Any]) -> torch.nn.Module:
    """HiFT from constructor arguments; `f0_predictor` is a mapping of ConvRNNF0Predictor's."""
    from flashcosyvoice.modules.hifigan import ConvRNNF0Predictor, HiFTGenerator

    kwargs = dict(config)
    if "f0_predictor" in kwargs:
        kwargs["f0_predictor"] = ConvRNNF0Predictor(**kwargs["f0_predictor"])
    return HiFTGenerator(**kwargs)


@dataclass
class Token2WavNetworks:
    flow: torch.nn.Module  # CausalMaskedDiffWithXvec
    hift: torch.nn.Module  # HiFTGenerator
    device: torch.device

    @property
    def lookahead(self) -> int:
        return int(self.flow.pre_lookahead_len)

    @property
    def up_rate(self) -> int:
        """Mel frames per code."""
        return int(self.flow.up_rate)

    def vocode(self, mel: torch.Tensor, cache_source: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """HiFT on `mel` [1, 80, frames] -> (speech [1, 480 * frames], source). Its excitation
        draws random phases and noise from torch's global generator; they are drawn here from
        `seed` inside a forked generator, so calls are reproducible and sessions independent."""
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=self.device.type):
            torch.manual_seed(seed)
            return self.hift(mel, cache_source)

    def ensure_scratch(self, frames: int, n_timesteps: int) -> None:
        """Make the decoder's streaming scratch buffers hold `frames` cached mel frames for
        `n_timesteps` solver steps. The library writes each call's new caches into them and
        returns views of them, so callers copy what they keep."""
        held = self.flow.decoder.att_cache_buffer.shape
        if held[0] < n_timesteps or held[4] < frames:
            size_scratch(self.flow, max(frames, held[4]), max(n_timesteps, held[0]))


def size_scratch(flow: torch.nn.Module, frames: int, n_timesteps: int) -> None:
    """Reassign the flow decoder's and its DiT's scratch buffers (the library allocates them at
    a fixed 16 steps x 1000 frames of the real model's width: 2.1 GB) to the config's width."""
    cfm = flow.decoder
    dit = cfm.estimator
    block = dit.blocks[0]
    depth, heads, head_dim = len(dit.blocks), block.attn.num_heads, block.attn.head_dim
    conv_channels = block.conv.in_channels + block.conv.out_channels
    like = dict(device=cfm.rand_noise.device, dtype=cfm.rand_noise.dtype)
    dit.att_cache_buffer = torch.zeros(depth, 2, heads, frames, 2 * head_dim, **like)
    dit.cnn_cache_buffer = torch.zeros(depth, 2, conv_channels, 2, **like)
    cfm.att_cache_buffer = torch.zeros(n_timesteps, depth, 2, heads, frames, 2 * head_dim, **like)
    cfm.cnn_cache_buffer = torch.zeros(n_timesteps, depth, 2, conv_channels, 2, **like)


def _without_compile(encoder: torch.nn.Module) -> None:
    """The package wraps the encoder's `forward_chunk` in torch.compile (eager backend), which
    only adds tracing time; bind the plain function on this instance."""
    method = type(encoder).forward_chunk
    plain = getattr(method, "_torchdynamo_orig_callable", method)
    encoder.forward_chunk = plain.__get__(encoder)


def load_networks(folder: str | Path, device: str | torch.device = "cpu", seed: int = 0) -> Token2WavNetworks:
    """The flow model and HiFT from `folder` (flow.yaml, flow.pt, hift.pt, optional hift.yaml)."""
    folder = Path(folder)
    missing = [name for name in (FLOW_CONFIG, FLOW_WEIGHTS, HIFT_WEIGHTS) if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"token2wav assets missing in {folder}: {', '.join(missing)} "
                                "(expected the checkpoint's assets/token2wav/ folder)")
    device = torch.device(device)
    flow = read_flow_yaml(folder / FLOW_CONFIG)["flow"]
    flow.load_state_dict(torch.load(folder / FLOW_WEIGHTS, map_location="cpu", weights_only=True), strict=True)
    _without_compile(flow.encoder)
    generator = torch.Generator().manual_seed(seed)
    flow.decoder.rand_noise = torch.randn(1, flow.output_size, NOISE_FRAMES, generator=generator)
    size_scratch(flow, frames=0, n_timesteps=0)
    hift_config = folder / HIFT_CONFIG
    hift = hift_generator(yaml.safe_load(hift_config.read_text()) if hift_config.is_file() else {})
    state = torch.load(folder / HIFT_WEIGHTS, map_location="cpu", weights_only=True)
    hift.load_state_dict({key.removeprefix(HIFT_KEY_PREFIX): value for key, value in state.items()}, strict=True)
    return Token2WavNetworks(flow=flow.to(device).eval(), hift=hift.to(device).eval(), device=device)
