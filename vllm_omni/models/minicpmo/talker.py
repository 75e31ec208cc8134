"""MiniCPM-o's talker (Stage 1) per speaking unit (docs/minicpmo.md, "Talker").

For each unit the LLM speaks, the talker gets the unit's text tokens with the LLM's
last-layer hidden state of each (the state computed when that token was fed) and returns up to
25 codec codes:

1. Condition rows: for every token after the unit's first position (the decision token),
   `emb_text(token) + L2-normalised projector_semantic(hidden)`, then `emb_text(audio_bos)`.
2. Codes: each step's logits come from `head_code` on the last row; the sampled code is fed
   back through `emb_code`. 26 codes are sampled and the last is never returned (nor fed), so
   a full unit yields 25. The codec's end code may end the unit early only on a turn's first
   unit and on the unit that ends the turn; elsewhere it is never sampled.
3. The talker's keys, values and positions carry from unit to unit within a turn and start
   over when the turn ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import DynamicCache

from vllm_omni.models.minicpmo.config import MiniCPMOConfig
from vllm_omni.models.minicpmo.modules import MiniCPMTTS

SAMPLED_PER_UNIT = 26  # the last sample is dropped: 25 codes per full unit


@dataclass(frozen=True)
class TalkerSampling:
    """Temperature 0 is greedy. The repetition penalty covers the turn's last `window` codes."""

    temperature: float = 0.8
    repetition_penalty: float = 1.05
    window: int = 16


@dataclass
class TalkerTurn:
    """One session's talker state within a turn."""

    cache: DynamicCache = field(default_factory=DynamicCache)
    position: int = 0  # the next row's position
    codes: list[int] = field(default_factory=list)  # codes returned so far this turn
    units: int = 0  # units spoken so far this turn


class Talker:
    def __init__(self, tts: MiniCPMTTS, sampling: TalkerSampling = TalkerSampling()):
        self.tts = tts.eval()
        self.sampling = sampling
        self.config = tts.config
        self.end_code = self.config.num_audio_tokens - 1

    @classmethod
    def from_checkpoint(cls, path: str | Path, sampling: TalkerSampling = TalkerSampling()) -> Talker:
        """The talker with the checkpoint's `tts.*` weights."""
        tts = MiniCPMTTS(MiniCPMOConfig.from_pretrained(path).tts_config)
        prefix = "tts."
        tts.load_state_dict({name[len(prefix):]: tensor for name, tensor in
                             load_file(Path(path) / "model.safetensors").items() if name.startswith(prefix)},
                            strict=True)
        return cls(tts, sampling)

    def condition_rows(self, token_ids: Sequence[int], hidden: torch.Tensor) -> torch.Tensor:
        """[len(token_ids), hidden]: rows for token_ids[1:] with their hidden states, then audio_bos."""
        ids = torch.tensor(list(token_ids[1:]), dtype=torch.long)
        rows = self.tts.emb_text(ids)
        if ids.numel():
            projected = self.tts.projector_semantic(hidden[1:])
            if self.config.normalize_projected_hidden:
                projected = torch.nn.functional.normalize(projected, dim=-1)
            rows = rows + projected
        bos = self.tts.emb_text(torch.tensor([self.config.audio_bos_token_id]))
        return torch.cat([rows, bos])

    @torch.no_grad()
    def speak_unit(self, turn: TalkerTurn, token_ids: Sequence[int], hidden: torch.Tensor, *, ends_turn: bool,
                   generator: torch.Generator | None = None) -> list[int]:
        """The unit's codes (`hidden`: [len(token_ids), llm_dim], the LLM's state per token)."""
        may_end = turn.units == 0 or ends_turn
        rows = self.condition_rows(token_ids, hidden)
        logits = self._step(turn, rows)
        codes: list[int] = []
        window = self.sampling.window
        for step in range(SAMPLED_PER_UNIT):
            code = self._sample(logits, (turn.codes[-window:] + codes)[-window:], may_end, generator)
            if code == self.end_code or step == SAMPLED_PER_UNIT - 1:
                break
            codes.append(code)
            logits = self._step(turn, self.tts.emb_code[0](torch.tensor([code])))
        turn.codes += codes
        turn.units += 1
        return codes

    def _step(self, turn: TalkerTurn, rows: torch.Tensor) -> torch.Tensor:
        """Feed `rows` at the turn's next positions; the logits after the last."""
        positions = torch.arange(turn.position, turn.position + rows.shape[0])[None]
        output = self.tts.model(inputs_embeds=rows[None], position_ids=positions, past_key_values=turn.cache,
                                use_cache=True)
        turn.position += rows.shape[0]
        return self.tts.head_code[0](output.last_hidden_state[0, -1])

    def _sample(self, logits: torch.Tensor, recent_codes: list[int], may_end: bool,
                generator: torch.Generator | None) -> int:
        """`recent_codes`: the turn's last codes, which the repetition penalty covers."""
        logits = logits.clone()
        recent = torch.tensor(sorted(set(recent_codes)), dtype=torch.long)
        if recent.numel():
            penalty = self.sampling.repetition_penalty
            picked = logits[recent]
            logits[recent] = torch.where(picked > 0, picked / penalty, picked * penalty)
        if not may_end:
            logits[self.end_code] = float("-inf")
        if self.sampling.temperature == 0:
            return int(logits.argmax())
        probabilities = torch.softmax(logits / self.sampling.temperature, dim=-1)
        return int(torch.multinomial(probabilities, 1, generator=generator))
