"""Mimi, frame by frame: a session's streaming encoder for the user's 80 ms frames and streaming
decoder for the model's (docs/moshi.md, "Mimi streaming").

The encoder is transformers' own streaming path (causal convolutions with a padding cache, the
transformer with a KV cache). transformers decodes whole sequences only, so the decoder keeps
its own state per layer: a causal convolution keeps its last `kernel - stride` inputs, a
transposed convolution the tail of its output that overlaps the next frame's, and the
transformer its KV cache. Every frame's samples are then those of decoding the whole sequence
at once, up to float summation order.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import DynamicCache
from transformers.models.mimi.modeling_mimi import (
    MimiConv1d,
    MimiConv1dPaddingCache,
    MimiConvTranspose1d,
    MimiModel,
    MimiResnetBlock,
)


class _ConvState:
    """A causal convolution's left context: its last `padding_total` inputs (zeros at first,
    as the whole-sequence path pads with `pad_mode` "constant")."""

    def __init__(self, layer: MimiConv1d):
        if layer.pad_mode != "constant" or not layer.causal:
            raise ValueError("Mimi's decoder convolutions are causal with constant padding")
        self.layer, self.kept = layer, None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        padding = int(self.layer.padding_total)
        if self.kept is None:
            self.kept = x.new_zeros(x.shape[0], x.shape[1], padding)
        padded = torch.cat([self.kept, x], dim=-1)
        self.kept = padded[..., padded.shape[-1] - padding:]
        return self.layer.conv(padded)


class _TransposedConvState:
    """A causal transposed convolution's overlap: each frame's last `kernel - stride` outputs
    (without the bias, which the next frame's own outputs carry) add to the next frame's first."""

    def __init__(self, layer: MimiConvTranspose1d):
        if layer.padding_left != 0:
            raise ValueError("Mimi's transposed convolutions trim on the right only (trim_right_ratio 1)")
        self.layer, self.overlap = layer, None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.layer.conv
        out = conv(x)
        keep = out.shape[-1] - self.layer.padding_right
        if self.overlap is not None:
            out = torch.cat([out[..., :self.overlap.shape[-1]] + self.overlap, out[..., self.overlap.shape[-1]:]], -1)
        tail = out[..., keep:]
        self.overlap = tail if conv.bias is None else tail - conv.bias[None, :, None]
        return out[..., :keep]


def _streaming_layers(layers: nn.ModuleList) -> list:
    """Each decoder layer as a callable that keeps its own streaming state."""
    steps: list = []
    for layer in layers:
        if isinstance(layer, MimiConv1d):
            steps.append(_ConvState(layer))
        elif isinstance(layer, MimiConvTranspose1d):
            steps.append(_TransposedConvState(layer))
        elif isinstance(layer, MimiResnetBlock):
            steps.append(_ResidualState(layer))
        else:
            steps.append(layer)
    return steps


class _ResidualState:
    def __init__(self, block: MimiResnetBlock):
        if not isinstance(block.shortcut, nn.Identity):
            raise ValueError("Mimi's residual blocks have identity shortcuts (use_conv_shortcut false)")
        self.steps = _streaming_layers(block.block)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        for step in self.steps:
            out = step(out)
        return x + out


def quantize(mimi: MimiModel, embeddings: torch.Tensor, num_codebooks: int) -> torch.Tensor:
    """Frames' latents [B, hidden, 1] (several sessions' at once) → their codes [B, num_codebooks]."""
    return mimi.quantizer.encode(embeddings, num_codebooks)[:, :, 0].T


class MimiEncoderStream:
    """One session's user audio → one latent frame per `frame_samples` input samples, through
    transformers' streaming path (its `_encode_frame` up to the quantizer, which `quantize`
    runs for a batch of sessions)."""

    def __init__(self, mimi: MimiModel):
        self.mimi = mimi
        self._past = DynamicCache(config=mimi.config)
        self._padding = MimiConv1dPaddingCache(*_padding_layout(mimi))

    @torch.inference_mode()
    def embed(self, frame: torch.Tensor) -> torch.Tensor:
        """`frame` (frame_samples at the codec's rate) → its latent [1, hidden, 1]."""
        hidden = self.mimi.encoder(frame.view(1, 1, -1), padding_cache=self._padding)
        hidden = self.mimi.encoder_transformer(hidden.transpose(1, 2), past_key_values=self._past, use_cache=True,
                                               return_dict=True).last_hidden_state.transpose(1, 2)
        latent = self.mimi.downsample(hidden, padding_cache=self._padding)
        if latent.shape[-1] != 1:
            raise ValueError(f"a Mimi frame is {frame.numel()} samples; it gave {latent.shape[-1]} frames")
        return latent


def _padding_layout(mimi: MimiModel) -> tuple[int, list[int], list[str], list[int]]:
    """The encoder's padding-cache layout, as transformers' `MimiModel.encode` builds it: every
    causal convolution of the encoder, then the downsampling one."""
    layers = [mimi.encoder.get_submodule(name) for name in mimi.encoder._mimiconv1d_layer_names] + [mimi.downsample]
    return (len(layers), [layer.padding_total for layer in layers], [layer.pad_mode for layer in layers],
            [layer.in_channels for layer in layers])


class MimiDecoderStream:
    """One session's model codes → its speech, frame by frame."""

    def __init__(self, mimi: MimiModel):
        self.mimi = mimi
        self._upsample = _TransposedConvState(mimi.upsample)
        self._past = DynamicCache(config=mimi.config)
        self._decoder = _streaming_layers(mimi.decoder.layers)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """One frame's codes [num_codebooks] → its samples (float32, frame_samples)."""
        hidden = self._upsample(self.mimi.quantizer.decode(codes.view(1, -1, 1)))
        hidden = self.mimi.decoder_transformer(hidden.transpose(1, 2), past_key_values=self._past, use_cache=True,
                                               return_dict=True).last_hidden_state.transpose(1, 2)
        for step in self._decoder:
            hidden = step(hidden)
        return hidden[0, 0]
