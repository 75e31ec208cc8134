"""Qwen2.5-Omni's token2wav, streamed: codes -> mel (DiT, flow matching) -> waveform (BigVGAN).

The DiT is not causal. Its attention works in blocks of `block_size` mel frames (12 codes):
each layer sees its own block, a layer listed in `look_ahead_layers` also the next one, a layer
in `look_backward_layers` also the one before. The ODE solver runs the network many times
(36 passes for 10 steps), so over a whole decode every frame depends on every code. Streamed,
each window of blocks is solved over its codes plus `left_codes` before it and the DiT's own
look-ahead after it, from the same noise frames a one-shot decode would use (the noise is drawn
frame by frame from the request's seeded generator, which gives exactly the one-shot draw), and
keeps the mel of its own blocks. BigVGAN is convolutional: each piece is vocoded with
`vocoder_context_frames` of mel on both sides, the right side from the window's look-ahead
(solved again, with more context, by the next window), so a window's audio leaves at once.

A stream given all its codes at once (async_chunk off) solves the whole answer in one window
and vocodes the whole mel: exactly transformers' `Qwen2_5OmniToken2WavModel.forward` with the
same seed. Streamed output differs from it by a bound measured in docs/qwen2_5_omni.md.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

from vllm_omni.models.qwen2_5_omni.checkpoint import Voice

ODE_STEPS, GUIDANCE_SCALE, SWAY_COEFFICIENT = 10, 0.5, -1.0  # transformers' defaults


class _SameInputCache(torch.nn.Module):
    """The DiT's speaker encoder (ECAPA) sees the same reference mel in each of a solve's 36
    passes and was half of a solve's time: this computes it once per distinct input, per thread
    (replicas of the stage share the module)."""

    def __init__(self, encoder: torch.nn.Module):
        super().__init__()
        self.encoder = encoder
        self._last = threading.local()

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        seen = getattr(self._last, "pair", None)
        if seen is None or seen[0].shape != mel.shape or not torch.equal(seen[0], mel):
            seen = self._last.pair = (mel, self.encoder(mel))
        return seen[1]


def cache_speaker_encoder(dit: torch.nn.Module) -> None:
    """Compute the DiT's speaker encoding once per reference mel (idempotent; exact)."""
    embed = dit.input_embed
    if not isinstance(embed.spk_encoder, _SameInputCache):
        embed.spk_encoder = _SameInputCache(embed.spk_encoder)


@torch.no_grad()
def solve_mel(dit: torch.nn.Module, codes: torch.Tensor, noise: torch.Tensor, conditioning: torch.Tensor,
              reference_mel: torch.Tensor) -> torch.Tensor:
    """[B, mel_dim, frames] mel of `codes` [B, n] from `noise` [B, n * repeats, mel_dim], in the
    voices of `conditioning` [B, enc_emb_dim] and `reference_mel` [B, T, mel_dim], as
    transformers' `Qwen2_5OmniToken2WavDiTModel.sample` computes it from its own noise draw."""
    speaker = conditioning.to(noise.device).unsqueeze(1).repeat(1, codes.shape[1] * dit.repeats, 1)
    reference = reference_mel.to(noise.device)

    def velocity(time_step: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        guided, unguided = torch.chunk(dit(hidden_states=state, quantized_code=codes, speaker_embedding=speaker,
                                           condition_vector=reference, time_step=time_step, apply_cfg=True), 2)
        return guided + (guided - unguided) * GUIDANCE_SCALE

    times = torch.linspace(0, 1, ODE_STEPS, device=noise.device, dtype=speaker.dtype)
    times += SWAY_COEFFICIENT * (torch.cos(torch.pi / 2 * times) - 1 + times)
    return RungeKutta4ODESolver(function=velocity, initial_value=noise).integrate(times)[-1].permute(0, 2, 1)


@dataclass(frozen=True)
class Window:
    """The next DiT solve of a stream: codes [start, stop) solved, the mel of [solved, end) kept."""

    start: int
    end: int
    stop: int
    codes: torch.Tensor  # [1, stop - start]
    noise: torch.Tensor  # [1, (stop - start) * repeats, mel_dim]


def solve_windows(streams: list[Token2WavStream], windows: list[Window]) -> None:
    """Solve each stream's window, windows of one length and voice shape in one batched solve
    (the DiT's many small passes cost about the same for one row as for eight)."""
    groups: dict[tuple, list[int]] = {}
    for i, (stream, window) in enumerate(zip(streams, windows, strict=True)):
        groups.setdefault((window.codes.shape[1], tuple(stream.voice.reference_mel.shape)), []).append(i)
    for members in groups.values():
        dit = streams[members[0]].dit
        mel = solve_mel(dit, torch.cat([windows[i].codes for i in members]),
                        torch.cat([windows[i].noise for i in members]),
                        torch.cat([streams[i].voice.conditioning for i in members]),
                        torch.cat([streams[i].voice.reference_mel for i in members]))
        for row, i in enumerate(members):
            streams[i].take_mel(windows[i], mel[row:row + 1])


@dataclass(frozen=True)
class Windows:
    """How a stream cuts its codes into DiT windows (in codes; rounded up to whole DiT blocks)."""

    first: int  # the first window: short, for fast first audio
    most: int  # later windows grow with the audio already solved (doubling), up to this
    left_context: int  # codes before a window that its solve sees
    vocoder_context_frames: int  # mel frames of BigVGAN context on each side of a piece
    one_shot: bool = False  # one window over the whole answer, once its last code arrived


class Token2WavStream:
    """One answer's codes in, its waveform out, piece by piece (see the module docstring). The
    windows depend only on the codes, never on how they arrived."""

    def __init__(self, token2wav: torch.nn.Module, voice: Voice, seed: int, windows: Windows):
        self.dit, self.vocoder = token2wav.code2wav_dit_model, token2wav.code2wav_bigvgan_model
        cache_speaker_encoder(self.dit)
        config = self.dit.config
        self.block_codes = config.block_size // config.repeats
        self.ahead_codes = self.block_codes * len(config.look_ahead_layers)
        self.first, self.most, self.left = (_blocks(codes, self.block_codes)
                                            for codes in (windows.first, windows.most, windows.left_context))
        self.one_shot, self.context = windows.one_shot, windows.vocoder_context_frames
        self.hop = math.prod(self.vocoder.config.upsample_rates)
        self.voice = voice
        self.device = next(self.dit.parameters()).device
        self._generator = torch.Generator().manual_seed(seed)
        self.codes: list[int] = []
        self._noise = torch.zeros(1, 0, config.mel_dim)
        self._mel = torch.zeros(1, config.mel_dim, 0, device=self.device)
        self._ahead = self._mel  # provisional mel after `_mel` (the last window's look-ahead)
        self._solved = 0  # codes whose mel is in `_mel`
        self._vocoded = 0  # mel frames whose samples were returned
        self.final = False

    def add(self, codes: list[int], final: bool) -> None:
        self.codes += codes
        draw = torch.randn(1, len(codes) * self.dit.repeats, self._noise.shape[2], generator=self._generator)
        self._noise = torch.cat([self._noise, draw], dim=1)
        self.final = self.final or final

    def _window_end(self) -> int:
        """Where the next window ends if it can be solved now (its look-ahead arrived), else `_solved`."""
        if self.one_shot:
            return len(self.codes) if self.final else self._solved
        # a window costs about the same whatever its size (the ODE's passes dominate), so each is as
        # long as all before it together: the audio already out covers the next one's time
        end = self._solved + (self.first if self._solved == 0 else min(self.most, max(self.first, self._solved)))
        if self.final:
            return min(end, len(self.codes))
        return end if len(self.codes) >= end + self.ahead_codes else self._solved

    @property
    def finished(self) -> bool:
        """Every code's samples returned (the last code arrived)."""
        return self.final and self._solved == len(self.codes) and self._vocoded == self._mel.shape[2]

    def ready(self) -> bool:
        """A step would solve a window or finish the stream."""
        return self._window_end() > self._solved or (self.final and not self.finished)

    def next_window(self) -> Window | None:
        """The window to solve now, if one can be (`ready`)."""
        end = self._window_end()
        if end <= self._solved:
            return None
        start = max(0, self._solved - self.left)
        stop = min(len(self.codes), end + self.ahead_codes)
        return Window(start, end, stop, torch.tensor([self.codes[start:stop]], device=self.device),
                      self._noise[:, start * self.dit.repeats: stop * self.dit.repeats].to(self.device))

    def take_mel(self, window: Window, mel: torch.Tensor) -> None:
        """Keep the solved mel [1, mel_dim, frames] of `window`'s own codes; its look-ahead's as provisional."""
        repeats = self.dit.repeats
        split = (window.end - window.start) * repeats
        self._mel = torch.cat([self._mel, mel[:, :, (self._solved - window.start) * repeats: split]], dim=2)
        self._ahead = mel[:, :, split:]  # solved again, with more context, by the next window
        self._solved = window.end

    def step(self) -> torch.Tensor:
        """Solve the next window and vocode its mel: samples [n] (maybe none)."""
        window = self.next_window()
        if window is not None:
            solve_windows([self], [window])
        return self.vocode()

    @torch.no_grad()
    def vocode(self) -> torch.Tensor:
        """Samples of the mel frames solved since the last call, vocoded with `context` frames on
        each side: final mel on the left, the look-ahead's provisional mel on the right."""
        frames = self._mel.shape[2]
        if frames <= self._vocoded:
            return torch.zeros(0)
        start = max(0, self._vocoded - self.context)
        mel = torch.cat([self._mel[:, :, start:], self._ahead[:, :, :self.context]], dim=2)
        samples = self.vocoder(mel).reshape(-1)
        piece = samples[(self._vocoded - start) * self.hop: (frames - start) * self.hop]
        self._vocoded = frames
        return piece.float().cpu()


def _blocks(codes: int, block: int) -> int:
    """`codes` rounded up to whole DiT blocks."""
    return -(-codes // block) * block
