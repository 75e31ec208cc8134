"""Streaming code2wav: codec frames in, 24 kHz samples out, chunk by chunk.

`ExactCode2WavStream` carries the decoder's state from chunk to chunk, so the concatenated
chunks equal a one-shot `code2wav(all_frames)` (up to float rounding) at any chunk size,
and each chunk costs only its own frames:

* pre-transformer: causal sliding-window attention; its KV cache holds the window;
* causal convolutions (stride 1): the last `(kernel - 1) * dilation` input samples;
* transposed convolutions with kernel 2r and stride r: output between input frames j and
  j+1 needs both, so the last input frame is held back until the next one arrives. These
  one-frame look-aheads are the decoder's 555-sample look-ahead: the samples they withhold
  come out with the next chunk; after the last chunk they do not exist (one-shot drops
  them too: `len(code2wav(T frames)) == 1920 T - 555`).

`LeftContextCode2WavStream` is the reference's approximation, kept for comparison: each
chunk is re-decoded with `left_context` frames before it and the overlap is cut away.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from typing import Protocol

import torch
from transformers.cache_utils import DynamicCache
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCausalConvNet,
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2Wav,
    Qwen3OmniMoeCode2WavDecoderBlock,
    Qwen3OmniMoeCode2WavDecoderResidualUnit,
    Qwen3OmniMoeConvNeXtBlock,
    Qwen3OmniMoeSnakeBeta,
)


class Code2WavStream(Protocol):
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Decode the next frames ([16, n] codec ids); return the new final samples [m]."""
        ...


class ExactCode2WavStream:
    """Per-request streaming state; see the module docstring."""

    def __init__(self, code2wav: Qwen3OmniMoeCode2Wav):
        self.model = code2wav
        self.frames_seen = 0
        self._kv_cache = DynamicCache(config=code2wav.config)
        self._held: dict[int, torch.Tensor] = {}  # id(module) -> samples it keeps, [1, channels, held]

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        if codes.shape[-1] == 0:
            return torch.zeros(0, device=self.model.code_offset.device)
        return _ConvPass(self._held).run(self.model, self._transform(codes))[0]

    def batch_key(self, frames: int) -> Hashable:
        """Streams whose next `frames` decode with the same key can share one conv pass: same
        model, same new length, and held samples of the same shapes (these differ until each
        look-ahead has seen its first output, i.e. over a stream's first frames)."""
        return id(self.model), frames, tuple((key, tuple(held.shape)) for key, held in self._held.items())

    def _transform(self, codes: torch.Tensor) -> torch.Tensor:
        """Embed the new frames and run the pre-transformer over them (advancing its KV
        cache): the conv stack's input, [1, hidden, n]."""
        model = self.model
        n = codes.shape[-1]
        codes = codes.reshape(1, model.config.num_quantizers, n).to(model.code_offset.device)
        hidden = model.code_embedding(codes + model.code_offset).mean(1)
        positions = torch.arange(self.frames_seen, self.frames_seen + n, device=hidden.device)[None]
        hidden = model.pre_transformer(inputs_embeds=hidden, position_ids=positions,
                                       past_key_values=self._kv_cache, use_cache=True).last_hidden_state
        self.frames_seen += n
        return hidden.permute(0, 2, 1)


def decode_batch(streams: Sequence[Code2WavStream], codes: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`[stream.decode(c) for stream, c in zip(streams, codes)]`, computed by `decode_groups`."""
    samples: list[torch.Tensor] = [torch.zeros(0)] * len(streams)
    for index, decoded in decode_groups(streams, codes):
        samples[index] = decoded
    return samples


@torch.no_grad()
def decode_groups(streams: Sequence[Code2WavStream],
                  codes: Sequence[torch.Tensor]) -> Iterator[tuple[int, torch.Tensor]]:
    """Each stream's `decode(codes[i])` as (i, samples), with the conv stack (the heavy part)
    run once per group of exact streams that share a `batch_key`: their pre-transformer
    outputs and held samples stacked on the batch dimension, the held samples split back
    afterwards. Groups go in the order of their first member and each is yielded as soon as
    it is decoded, so the first stream (the step worker puts the listener closest to running
    dry first) is not held back by the rest of the round. A stream alone in its group, or
    not exact, decodes as `decode` does (bit-identical); a shared pass differs from it by
    float rounding only."""
    groups: dict[Hashable, list[int]] = {}
    for i, (stream, chunk) in enumerate(zip(streams, codes, strict=True)):
        shareable = isinstance(stream, ExactCode2WavStream) and chunk.shape[-1]
        groups.setdefault(stream.batch_key(chunk.shape[-1]) if shareable else ("alone", i), []).append(i)
    for members in groups.values():
        if len(members) == 1:
            yield members[0], streams[members[0]].decode(codes[members[0]])
            continue
        group = [streams[i] for i in members]
        hidden = torch.cat([stream._transform(codes[i]) for stream, i in zip(group, members, strict=True)])
        held = {key: torch.cat([stream._held[key] for stream in group]) for key in group[0]._held}
        decoded = _ConvPass(held).run(group[0].model, hidden)
        for row, (stream, i) in enumerate(zip(group, members, strict=True)):
            stream._held = {key: rows[row:row + 1] for key, rows in held.items()}
            yield i, decoded[row]


class _ConvPass:
    """The upsample and decoder stacks over `[batch, channels, time]`, reading and replacing
    each stateful module's held samples in `held` (id(module) -> [batch, channels, held])."""

    def __init__(self, held: dict[int, torch.Tensor]):
        self.held = held

    def run(self, model: Qwen3OmniMoeCode2Wav, hidden: torch.Tensor) -> torch.Tensor:
        """The new final samples of each batch row, [batch, m] (m may be 0)."""
        for module in (*[block for blocks in model.upsample for block in blocks], *model.decoder):
            hidden = self._run(module, hidden)
            if hidden.shape[-1] == 0:  # everything new is held back by a look-ahead
                return hidden.new_zeros(hidden.shape[0], 0)
        return hidden.clamp(min=-1, max=1).reshape(hidden.shape[0], -1)

    def _run(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if isinstance(module, Qwen3OmniMoeCausalConvNet):
            return self._causal_conv(module, x)
        if isinstance(module, Qwen3OmniMoeCausalTransConvNet):
            return self._transposed_conv(module, x)
        if isinstance(module, Qwen3OmniMoeConvNeXtBlock):
            y = self._causal_conv(module.dwconv, x).permute(0, 2, 1)
            y = module.pwconv2(module.act(module.pwconv1(module.norm(y))))
            return x + (module.gamma * y).permute(0, 2, 1)
        if isinstance(module, Qwen3OmniMoeCode2WavDecoderResidualUnit):
            y = self._causal_conv(module.conv1, module.act1(x))
            return x + self._causal_conv(module.conv2, module.act2(y))
        if isinstance(module, Qwen3OmniMoeCode2WavDecoderBlock):
            for inner in module.block:
                x = self._run(inner, x)
                if x.shape[-1] == 0:
                    break
            return x
        if isinstance(module, Qwen3OmniMoeSnakeBeta):  # pointwise: no state
            return module(x)
        raise TypeError(f"no streaming rule for {type(module).__name__}")

    def _causal_conv(self, module: Qwen3OmniMoeCausalConvNet, x: torch.Tensor) -> torch.Tensor:
        if module.stride != 1:
            raise ValueError("streaming needs stride-1 causal convolutions")
        if module.padding == 0:
            return module.conv(x)
        past = self.held.get(id(module))
        if past is None:  # the one-shot decoder zero-pads on the left
            past = x.new_zeros(x.shape[0], x.shape[1], module.padding)
        joined = torch.cat((past, x), dim=-1)
        self.held[id(module)] = joined[..., -module.padding:]
        return module.conv(joined)

    def _transposed_conv(self, module: Qwen3OmniMoeCausalTransConvNet, x: torch.Tensor) -> torch.Tensor:
        kernel, stride = module.conv.kernel_size[0], module.conv.stride[0]
        if kernel == stride:  # no overlap between frames: nothing to carry
            return module(x)
        if kernel != 2 * stride:
            raise ValueError(f"streaming supports kernel == stride or 2 * stride, got {kernel}/{stride}")
        past = self.held.get(id(module))
        joined = x if past is None else torch.cat((past, x), dim=-1)
        self.held[id(module)] = joined[..., -1:]
        if joined.shape[-1] < 2:
            return joined[..., :0].new_zeros(joined.shape[0], module.conv.out_channels, 0)
        return module(joined)


class LeftContextCode2WavStream:
    """The reference's streaming rule: re-decode each chunk with left-context frames."""

    def __init__(self, code2wav: Qwen3OmniMoeCode2Wav, left_context: int):
        self.model = code2wav
        self.left_context = left_context
        self._frames: torch.Tensor | None = None

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        codes = codes.reshape(self.model.config.num_quantizers, -1)
        before = 0 if self._frames is None else self._frames.shape[-1]
        self._frames = codes if self._frames is None else torch.cat((self._frames, codes), dim=-1)
        context = min(self.left_context, before)
        window = self._frames[:, before - context:]
        samples = self.model(window[None].to(self.model.code_offset.device)).reshape(-1)
        lookahead = window.shape[-1] * int(self.model.total_upsample) - samples.numel()
        return samples[max(0, context * int(self.model.total_upsample) - lookahead):]


def make_code2wav_stream(code2wav: Qwen3OmniMoeCode2Wav, mode: str = "exact",
                         left_context: int = 25) -> Code2WavStream:
    if mode == "exact":
        return ExactCode2WavStream(code2wav)
    if mode == "left_context":
        return LeftContextCode2WavStream(code2wav, left_context)
    raise ValueError(f"unknown code2wav streaming mode {mode!r} (expected 'exact' or 'left_context')")
