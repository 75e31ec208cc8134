"""Mimi, frame by frame: a session's streaming encoder for the user's 80 ms frames and streaming
decoder for the model's (docs/moshi.md, "Mimi streaming").

transformers' Mimi runs whole sequences (its encoder also streams, one session at a time), so
each layer here keeps its own streaming state: a causal convolution its last `kernel - stride`
inputs, a transposed convolution the tail of its output that overlaps the next frame's, a
transformer its KV cache (a slot of mimi_transformer.py's pool). The frames of several sessions
then run as one batch through the convolutions (each row with its own state) and the
transformers. Streamed, the encoder gives exactly the codes of encoding the whole signal, and
the decoder the samples of decoding the whole sequence, up to float summation order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers.models.mimi.modeling_mimi import (
    MimiConv1d,
    MimiConvTranspose1d,
    MimiModel,
    MimiResnetBlock,
)

from vllm_omni.models.moshi.mimi_transformer import BatchedMimiTransformer


class _Layer:
    """A decoder layer with its streaming state; `run` steps the same layer of several sessions'
    streams (one row each) as one batch."""

    @classmethod
    def run(cls, states: Sequence[_Layer], x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class _Stateless(_Layer):
    def __init__(self, module: nn.Module):
        self.module = module

    @classmethod
    def run(cls, states: Sequence[_Stateless], x: torch.Tensor) -> torch.Tensor:
        return states[0].module(x)


class _ConvState(_Layer):
    """A causal convolution's left context: its last `padding_total` inputs; at first what the
    whole-sequence path pads with (zeros for `pad_mode` "constant", the first input repeated for
    "replicate")."""

    def __init__(self, layer: MimiConv1d):
        if layer.pad_mode not in ("constant", "replicate") or not layer.causal:
            raise ValueError("Mimi's convolutions are causal, with constant or replicate padding")
        self.layer, self.kept = layer, None

    def _start(self, x: torch.Tensor, padding: int) -> torch.Tensor:
        if self.layer.pad_mode == "constant":
            return x.new_zeros(1, x.shape[1], padding)
        return x[:, :, :1].expand(-1, -1, padding)

    @classmethod
    def run(cls, states: Sequence[_ConvState], x: torch.Tensor) -> torch.Tensor:
        padding = int(states[0].layer.padding_total)
        kept = [state._start(x[row:row + 1], padding) if state.kept is None else state.kept
                for row, state in enumerate(states)]
        padded = torch.cat([torch.cat(kept), x], dim=-1)
        kept = padded[..., padded.shape[-1] - padding:]
        for row, state in enumerate(states):
            state.kept = kept[row:row + 1]
        return states[0].layer.conv(padded)


class _TransposedConvState(_Layer):
    """A causal transposed convolution's overlap: each frame's last `kernel - stride` outputs
    (without the bias, which the next frame's own outputs carry) add to the next frame's first."""

    def __init__(self, layer: MimiConvTranspose1d):
        if layer.padding_left != 0:
            raise ValueError("Mimi's transposed convolutions trim on the right only (trim_right_ratio 1)")
        self.layer, self.overlap = layer, None

    @classmethod
    def run(cls, states: Sequence[_TransposedConvState], x: torch.Tensor) -> torch.Tensor:
        layer = states[0].layer
        out = layer.conv(x)
        keep, width = out.shape[-1] - layer.padding_right, layer.padding_right
        zeros = out.new_zeros(1, out.shape[1], width)
        overlap = torch.cat([zeros if s.overlap is None else s.overlap for s in states])
        out = torch.cat([out[..., :width] + overlap, out[..., width:]], -1)
        tail = out[..., keep:]
        tail = tail if layer.conv.bias is None else tail - layer.conv.bias[None, :, None]
        for row, state in enumerate(states):
            state.overlap = tail[row:row + 1]
        return out[..., :keep]


class _ResidualState(_Layer):
    def __init__(self, block: MimiResnetBlock):
        if not isinstance(block.shortcut, nn.Identity):
            raise ValueError("Mimi's residual blocks have identity shortcuts (use_conv_shortcut false)")
        self.steps = _streaming_layers(block.block)

    @classmethod
    def run(cls, states: Sequence[_ResidualState], x: torch.Tensor) -> torch.Tensor:
        return x + _run_stack([s.steps for s in states], x)


def _streaming_layers(layers: nn.ModuleList) -> list[_Layer]:
    """Each decoder layer with a streaming state of its own."""
    kinds = {MimiConv1d: _ConvState, MimiConvTranspose1d: _TransposedConvState, MimiResnetBlock: _ResidualState}
    return [kinds.get(type(layer), _Stateless)(layer) for layer in layers]


def _run_stack(stacks: Sequence[Sequence[_Layer]], x: torch.Tensor) -> torch.Tensor:
    """The same layers of several streams (`stacks`, one per row of `x`), layer by layer."""
    for states in zip(*stacks, strict=True):
        x = type(states[0]).run(states, x)
    return x


@torch.inference_mode()
def quantize(mimi: MimiModel, embeddings: torch.Tensor, num_codebooks: int) -> torch.Tensor:
    """Frames' latents [B, hidden, 1] (several sessions' at once) → their codes [B, num_codebooks]."""
    return mimi.quantizer.encode(embeddings, num_codebooks)[:, :, 0].T


class _TransformerState:
    """A stream's place in a batched Mimi transformer: its slot and its next position."""

    def __init__(self, transformer: BatchedMimiTransformer, slot: int):
        self.transformer, self.slot, self.position = transformer, slot, 0
        transformer.reset(slot)

    @classmethod
    def run(cls, states: Sequence[_TransformerState], x: torch.Tensor) -> torch.Tensor:
        """`x` [B, hidden, T] → the transformer's output, same shape."""
        out = states[0].transformer.step(x.transpose(1, 2), [s.slot for s in states], [s.position for s in states])
        for state in states:
            state.position += x.shape[-1]
        return out.transpose(1, 2)


class MimiEncoderStream:
    """One session's encoder state (its transformer in `slot` of `transformer`): `embed_frames`
    turns the next frame of several sessions into latents as one batch, `quantize` makes codes
    of them."""

    def __init__(self, mimi: MimiModel, transformer: BatchedMimiTransformer, slot: int):
        self.mimi = mimi
        self._encoder = _streaming_layers(mimi.encoder.layers)
        self._transformer = _TransformerState(transformer, slot)
        self._downsample = _ConvState(mimi.downsample)


@torch.inference_mode()
def embed_frames(streams: Sequence[MimiEncoderStream], frames: torch.Tensor) -> torch.Tensor:
    """Each stream's next frame, `frames` [B, frame_samples] → latents [B, hidden, 1], as one batch."""
    hidden = _run_stack([s._encoder for s in streams], frames.unsqueeze(1))
    hidden = _TransformerState.run([s._transformer for s in streams], hidden)
    latents = _ConvState.run([s._downsample for s in streams], hidden)
    if latents.shape[-1] != 1:
        raise ValueError(f"a Mimi frame is {frames.shape[-1]} samples; it gave {latents.shape[-1]} latent frames")
    return latents


class MimiDecoderStream:
    """One session's decoder state (its transformer in `slot` of `transformer`): `decode_frames`
    turns the next codes of several sessions into speech as one batch."""

    def __init__(self, mimi: MimiModel, transformer: BatchedMimiTransformer, slot: int):
        self.mimi = mimi
        self._upsample = _TransposedConvState(mimi.upsample)
        self._transformer = _TransformerState(transformer, slot)
        self._decoder = _streaming_layers(mimi.decoder.layers)


@torch.inference_mode()
def decode_frames(streams: Sequence[MimiDecoderStream], codes: torch.Tensor) -> torch.Tensor:
    """Each stream's next frame, `codes` [B, num_codebooks] → samples [B, frame_samples], as one batch."""
    mimi = streams[0].mimi
    hidden = _TransposedConvState.run([s._upsample for s in streams], mimi.quantizer.decode(codes.unsqueeze(-1)))
    hidden = _TransformerState.run([s._transformer for s in streams], hidden)
    return _run_stack([s._decoder for s in streams], hidden)[:, 0]
