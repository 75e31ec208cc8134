"""Streaming token2wav for one session: codec codes in, 24 kHz samples out (docs/minicpmo.md,
"Token2wav").

The rules are the reference's (MiniCPM-o 4.5's duplex loop over Step-Audio2's streaming
vocoder):

* Codes: a turn's buffer starts with 3 silence codes (4218). Whenever 25 + 3 codes are
  buffered, the 25 are vocoded with the 3 after them as the encoder's look-ahead, and the
  buffer moves on by 25. A flush (turn start, a unit's terminator) vocodes what is buffered
  while at least 3 + 5 codes are; the turn's end vocodes the rest as the last chunk.
* Flow: each chunk continues the voice's flow caches (encoder and per-solver-step DiT keys,
  values and convolution tails). Past prompt + 100 frames, both attention caches are cut to
  their first prompt-length frames and their last 100.
* HiFT: each call sees the previous call's last 8 mel frames before the new ones and reuses
  its last 3840 excitation samples; the 3840 samples those 8 frames give are cross-faded
  (Hamming) into the previous call's held-back tail; every call but the last holds its own
  last 3840 samples back, and the first of a turn is preceded by 3840 zeros. So every 25
  codes give exactly 24 000 samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from vllm_omni.models.minicpmo.token2wav_networks import Token2WavNetworks
from vllm_omni.models.minicpmo.token2wav_prompt import VoicePrompt

SILENCE_CODE = 4218
TURN_PREFIX = 3  # silence codes a turn's buffer starts with
CHUNK_CODES = 25
FLUSH_MIN_BODY = 5  # a flush vocodes while look-ahead + this many codes are buffered
KEPT_RECENT_FRAMES = 100  # attention caches keep prompt-length + this many frames
HIFT_MEL_CONTEXT = 8  # mel frames each HiFT call repeats from the previous one
SAMPLES_PER_FRAME = 480
OVERLAP = HIFT_MEL_CONTEXT * SAMPLES_PER_FRAME  # 3840 samples: cross-faded and held back

FlowCache = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Voice:
    """A voice prompt and the flow caches it leaves; every turn starts from copies of them."""

    prompt: VoicePrompt
    flow_cache: FlowCache

    @property
    def prompt_frames(self) -> int:
        return self.prompt.mel.shape[1]


def clone_cache(cache: FlowCache) -> FlowCache:
    return {name: tensor.clone() for name, tensor in cache.items()}


def _keep_prompt_and_recent(cache: torch.Tensor, dim: int, prompt_frames: int) -> torch.Tensor:
    if cache.shape[dim] <= prompt_frames + KEPT_RECENT_FRAMES:
        return cache
    return torch.cat([cache.narrow(dim, 0, prompt_frames),
                      cache.narrow(dim, cache.shape[dim] - KEPT_RECENT_FRAMES, KEPT_RECENT_FRAMES)], dim=dim)


class HiftStream:
    """HiFT over a turn's mel chunks with the cached context, cross-fade and hold-back above."""

    def __init__(self, networks: Token2WavNetworks, seed: int):
        self.networks = networks
        self.seed = seed
        self.calls = 0
        device = networks.device
        self._mel = torch.zeros(1, networks.flow.output_size, 0, device=device)
        self._source = torch.zeros(1, 1, 0, device=device)
        self._tail = torch.zeros(1, 0, device=device)
        self._fade = torch.from_numpy(np.hamming(2 * OVERLAP)).float().to(device)

    def push(self, mel: torch.Tensor, last: bool) -> torch.Tensor:
        """Samples [n] for the chunk's mel [1, 80, frames]."""
        mel = torch.cat([self._mel, mel], dim=2)
        speech, source = self.networks.vocode(mel, self._source, seed=self.seed + self.calls)
        self.calls += 1
        first = self._tail.shape[1] == 0
        if not first:
            speech = speech.clone()
            speech[:, :OVERLAP] = speech[:, :OVERLAP] * self._fade[:OVERLAP] + self._tail * self._fade[OVERLAP:]
        self._mel = mel[:, :, -HIFT_MEL_CONTEXT:].clone()
        self._source = source[:, :, -OVERLAP:].clone()
        self._tail = speech[:, -OVERLAP:].clone()
        if not last:
            speech = speech[:, :-OVERLAP]
            if first:
                speech = torch.cat([speech.new_zeros(1, OVERLAP), speech], dim=1)
        return speech[0]


class Token2WavStream:
    """One session's token2wav state: feed a turn's codes, get its audio as it is ready.

    Sessions share the networks but nothing else; calls on one network set must not run
    concurrently (the library computes in shared scratch buffers, copied out after each call).
    """

    def __init__(self, networks: Token2WavNetworks, voice: Voice, seed: int = 0, n_timesteps: int = 10):
        self.networks, self.voice, self.seed, self.n_timesteps = networks, voice, seed, n_timesteps
        lookahead = networks.lookahead
        networks.ensure_scratch(voice.prompt_frames + KEPT_RECENT_FRAMES
                                + networks.up_rate * (CHUNK_CODES + lookahead), n_timesteps)
        self.turns = 0
        self.reset_turn()

    def reset_turn(self) -> None:
        """Start a turn: the voice's caches, and 3 silence codes in the buffer."""
        self.buffer: list[int] = [SILENCE_CODE] * TURN_PREFIX
        self._flow_cache = clone_cache(self.voice.flow_cache)
        self._hift = HiftStream(self.networks, seed=self.seed + 100_003 * self.turns)
        self.turns += 1

    def push(self, codes: Sequence[int], flush: bool = False) -> np.ndarray:
        """Buffer the codes; return the float32 samples of every chunk now ready (maybe none).
        `flush` (turn start, a unit's terminator) also vocodes shorter chunks (see above)."""
        self.buffer += [int(code) for code in codes]
        lookahead = self.networks.lookahead
        pieces = []
        if flush:
            while len(self.buffer) >= lookahead + FLUSH_MIN_BODY:
                take = min(CHUNK_CODES + lookahead, len(self.buffer))
                pieces.append(self._chunk(self.buffer[:take], last=False))
                self.buffer = self.buffer[take - lookahead:]
        while len(self.buffer) >= CHUNK_CODES + lookahead:
            pieces.append(self._chunk(self.buffer[:CHUNK_CODES + lookahead], last=False))
            self.buffer = self.buffer[CHUNK_CODES:]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)

    def finish(self) -> np.ndarray:
        """End the turn: vocode the rest of the buffer as the last chunk; the next turn starts."""
        samples = self._chunk(self.buffer, last=True) if self.buffer else np.zeros(0, dtype=np.float32)
        self.reset_turn()
        return samples

    @torch.inference_mode()
    def _chunk(self, codes: list[int], last: bool) -> np.ndarray:
        networks, prompt_frames = self.networks, self.voice.prompt_frames
        tokens = torch.tensor([codes], dtype=torch.long, device=networks.device)
        mel, cache = networks.flow.inference_chunk(token=tokens, spk=self.voice.prompt.speaker.to(networks.device),
                                                   cache=self._flow_cache, last_chunk=last,
                                                   n_timesteps=self.n_timesteps)
        cache = clone_cache(cache)  # the library's caches are views of its scratch buffers
        cache["estimator_att_cache"] = _keep_prompt_and_recent(cache["estimator_att_cache"], 4, prompt_frames)
        cache["conformer_att_cache"] = _keep_prompt_and_recent(cache["conformer_att_cache"], 3, prompt_frames)
        self._flow_cache = cache
        speech = self._hift.push(mel, last)
        return speech.clamp(-1.0, 1.0).float().cpu().numpy()
