"""Moshi's per-frame loop (docs/moshi.md, "The frame loop"): each 80 ms of the user's audio
becomes Mimi codes; the temporal transformer reads the frame's column (the model's text token,
its own 8 codes, the user's 8 codes, summed embeddings), predicts the next text token; the depth
decoder then predicts the model's next 8 codes from that hidden state and token. Acoustic
codebooks (1..7) run one frame behind the semantic one (0) on both streams, as in transformers'
delay pattern, so a column holds codebook 0 of frame t and codebooks 1..7 of frame t - 1.

Column 0 is the start (every input its BOS id); column t + 1 reads user frame t and yields the
model's frame t: its text token and codebook 0 from column t's prediction, codebooks 1..7 from
column t + 1's. `FrameLoop.step` runs one column for a batch of sessions.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import MoshiForConditionalGeneration

from vllm_omni.models.moshi.depth import BatchedDepth
from vllm_omni.models.moshi.mimi_stream import (
    MimiDecoderStream,
    MimiEncoderStream,
    decode_frames,
    embed_frames,
    quantize,
)
from vllm_omni.models.moshi.mimi_transformer import BatchedMimiTransformer
from vllm_omni.models.moshi.temporal import BatchedTemporal
from vllm_omni.models.moshi.text import PAD_ID


@dataclass(frozen=True)
class Sampling:
    """Greedy at temperature 0; else temperature, then the top_k most likely (0: all)."""

    temperature: float = 0.0
    top_k: int = 0

    def pick(self, logits: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
        """One id per row of `logits` [B, vocab]; each row draws from its session's generator."""
        if self.temperature <= 0:
            return logits.argmax(-1)
        scaled = logits / self.temperature
        if 0 < self.top_k < scaled.shape[-1]:
            floor = scaled.topk(self.top_k, dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < floor, float("-inf"))
        probs = scaled.softmax(-1)
        return torch.cat([torch.multinomial(row, 1, generator=gen) for row, gen in zip(probs, generators, strict=True)])


@dataclass
class StreamState:
    """One session's streams: where its column stands and what the column holds."""

    slot: int
    generator: torch.Generator
    encoder: MimiEncoderStream
    decoder: MimiDecoderStream
    position: int = 0  # the temporal transformer's next position (= the column)
    text: int = 0  # the column's text token
    codes: torch.Tensor | None = None  # the column's 8 model codes
    previous_user: torch.Tensor | None = None  # the user's last frame's codes (its acoustic ones are due)


@dataclass(frozen=True)
class Frame:
    """The model's frame for a user frame: the text token said with it and its speech."""

    text_token: int
    codes: tuple[int, ...]  # its 8 Mimi codes
    audio: np.ndarray  # float32 at the codec's rate, one frame long
    chosen_at_s: float  # when the text token was chosen (monotonic)


class FrameLoop:
    """The loaded model's parts, shared by every session (calls from one thread)."""

    def __init__(self, model: MoshiForConditionalGeneration, slots: int, text: Sampling, audio: Sampling):
        self.model, self.text_sampling, self.audio_sampling = model, text, audio
        config = model.config
        self.num_codebooks = config.num_codebooks
        self.text_bos, self.audio_bos = config.vocab_size, config.audio_vocab_size
        self.frame_samples = int(config.sampling_rate / config.audio_encoder_config.frame_rate)
        self.sample_rate = config.sampling_rate
        self.temporal = BatchedTemporal(model.decoder, slots)
        self.depth = BatchedDepth(model.depth_decoder, self.num_codebooks)
        # a session's Mimi streams use its temporal slot; slot `slots` is the silence codes' own
        mimi = model.audio_encoder
        self.mimi_encoder = BatchedMimiTransformer(mimi.encoder_transformer, slots + 1)
        self.mimi_decoder = BatchedMimiTransformer(mimi.decoder_transformer, slots + 1)
        self.device, self.dtype = model.decoder.lm_head.weight.device, model.decoder.lm_head.weight.dtype
        silence = torch.zeros(1, self.frame_samples, device=self.device, dtype=self.dtype)
        self.silence_codes = self._codes([MimiEncoderStream(mimi, self.mimi_encoder, slots)], silence)[0]

    @torch.inference_mode()
    def open(self, seed: int) -> StreamState:
        """A session's streams, its start column run (the model's first prediction)."""
        slot = self.temporal.pool.claim()
        state = StreamState(slot, torch.Generator(device=self.device).manual_seed(seed),
                            MimiEncoderStream(self.model.audio_encoder, self.mimi_encoder, slot),
                            MimiDecoderStream(self.model.audio_encoder, self.mimi_decoder, slot))
        bos = torch.full((self.num_codebooks,), self.audio_bos, device=self.device)
        state.text, state.codes = self.text_bos, bos
        self._advance([state], [bos])
        state.codes = torch.cat([state.codes[:1], bos[1:]])  # codebooks 1..7 start one frame late
        return state

    def close(self, state: StreamState) -> None:
        self.temporal.pool.release(state.slot)

    @torch.inference_mode()
    def step(self, states: Sequence[StreamState], frames: Sequence[torch.Tensor],
             forced: Sequence[bool]) -> list[Frame]:
        """One column per session: its user frame (frame_samples at the codec's rate) heard, the
        model's frame out. A forced session's column says nothing: padding text and the codes
        of silence take the place of what the model had predicted for it."""
        bos = torch.full((self.num_codebooks,), self.audio_bos, device=self.device)
        heard = self._codes([state.encoder for state in states], torch.stack(list(frames)).to(self.device, self.dtype))
        users = []
        for state, codes, force in zip(states, heard, forced, strict=True):
            previous = bos if state.previous_user is None else state.previous_user
            users.append(torch.cat([codes[:1], previous[1:]]))
            state.previous_user = codes
            if force:
                state.text, state.codes = PAD_ID, self.silence_codes
        said = [(state.text, state.codes) for state in states]
        chosen_at = self._advance(states, users)
        frame_codes = torch.stack([torch.cat([codes[:1], state.codes[1:]])
                                   for state, (_, codes) in zip(states, said, strict=True)])
        audio = decode_frames([state.decoder for state in states], frame_codes).float().cpu().numpy()
        return [Frame(text, tuple(row_codes), row_audio, chosen_at)
                for (text, _), row_codes, row_audio in zip(said, frame_codes.tolist(), audio, strict=True)]

    def _advance(self, states: Sequence[StreamState], users: Sequence[torch.Tensor]) -> float:
        """Run each session's column; its next text token and codes become the column's inputs."""
        model = self.model
        moshi = torch.stack([state.codes for state in states])
        user = torch.stack(list(users))
        columns = torch.cat([moshi, user], dim=1)  # [B, 16], as transformers sums them: model's, then user's
        audio_embeds = sum(model.embed_tokens[cb](columns[:, cb]) for cb in range(columns.shape[1]))
        text = torch.tensor([state.text for state in states], device=self.device)
        embeds = (audio_embeds + model.decoder.model.embed_tokens(text)).unsqueeze(1)
        hidden, logits = self.temporal.step(embeds, [s.slot for s in states], [s.position for s in states])
        generators = [state.generator for state in states]
        next_text = self.text_sampling.pick(logits, generators)
        chosen_at = time.monotonic()
        next_codes = self.depth.codes(hidden, next_text, lambda logits: self.audio_sampling.pick(logits, generators))
        for row, state in enumerate(states):
            state.position += 1
            state.text, state.codes = int(next_text[row]), next_codes[row]
        return chosen_at

    def _codes(self, encoders: Sequence[MimiEncoderStream], frames: torch.Tensor) -> torch.Tensor:
        """Sessions' user frames [B, frame_samples] → their codes [B, num_codebooks], as one batch."""
        return quantize(self.model.audio_encoder, embed_frames(encoders, frames), self.num_codebooks)
