"""How MiniCPM-o picks each token of a unit (docs/minicpmo.md, "Deciding a unit").

After a unit's input is prefilled, the LLM's logits at its last audio row decide: listen
(`<|listen|>` ends the unit at once) or speak (text, up to 20 positions, then a terminator).
Per position:

1. A forced-listen unit takes `<|listen|>` without sampling (and leaves no trace in the
   repetition history); while the model's turn is open it takes `<|turn_eos|>` first.
2. The 20th position is `<|chunk_eos|>`, unsampled.
3. Otherwise one draw from the raw distribution keeps the model's own unit boundary: if it is
   `<|chunk_eos|>`, that is the token. Else `tts_pad`, the tokenizer's `bad_token_ids` and
   `<|chunk_eos|>` are masked, recently generated tokens are divided by the repetition
   penalty (whatever their sign), `<|turn_eos|>` gets its length penalty, and the token is
   sampled with temperature / top-k / top-p (temperature 0: argmax, for both draws).
4. `<|listen|>` while the model's turn is open becomes `<|tts_bos|>`: once speaking, the
   model stops by `<|turn_eos|>` (after which listening is allowed again), not by listening.
5. A token that would make the unit's text 28 characters or more is dropped for
   `<|chunk_eos|>`.

`<|listen|>`, `<|chunk_eos|>` and `<|chunk_tts_eos|>` end the unit. A test-only decision
script (a deploy must enable it) turns each unit into `listen`, `speak` or `speak_end` by
masking logits, so tests reach paths a random model never takes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from vllm_omni.models.minicpmo.opening_settings import ScriptedDecision

SPEAK_END_TEXT_TOKENS = 3  # a `speak_end` unit's text before it ends the turn


@dataclass(frozen=True)
class DuplexTokenIds:
    unit: int
    unit_end: int
    listen: int
    speak: int
    chunk_eos: int
    chunk_tts_eos: int
    turn_eos: int
    tts_bos: int
    tts_pad: int

    @classmethod
    def from_tokenizer(cls, tokenizer) -> DuplexTokenIds:
        tokens = {"unit": "<unit>", "unit_end": "</unit>", "listen": "<|listen|>", "speak": "<|speak|>",
                  "chunk_eos": "<|chunk_eos|>", "chunk_tts_eos": "<|chunk_tts_eos|>", "turn_eos": "<|turn_eos|>",
                  "tts_bos": "<|tts_bos|>", "tts_pad": "<|tts_pad|>"}
        return cls(**{name: tokenizer.convert_tokens_to_ids(token) for name, token in tokens.items()})

    @property
    def terminators(self) -> frozenset[int]:
        return frozenset({self.listen, self.chunk_eos, self.chunk_tts_eos})


@dataclass(frozen=True)
class UnitSampling:
    temperature: float = 0.7  # 0: argmax
    top_k: int = 20
    top_p: float = 0.8
    repetition_penalty: float = 1.05
    penalty_window: int = 512  # generated tokens the repetition penalty covers
    turn_eos_penalty: float = 1.1
    max_positions: int = 20  # per unit; the last is `<|chunk_eos|>`
    max_text_chars: int = 28


@dataclass(frozen=True)
class Choice:
    token: int
    ends_unit: bool
    is_text: bool  # response text (not the `<|speak|>` marker, not a terminator)


class UnitDecoder:
    """One session's token choices, unit after unit. `decode_text` turns ids into text (special
    tokens skipped) for the unit's character cap."""

    def __init__(self, ids: DuplexTokenIds, bad_token_ids: Sequence[int], decode_text: Callable[[list[int]], str],
                 sampling: UnitSampling = UnitSampling(), generator: torch.Generator | None = None):
        self.ids, self.sampling, self._decode_text, self._generator = ids, sampling, decode_text, generator
        self._forbidden = torch.tensor(sorted({ids.tts_pad, ids.chunk_eos, *bad_token_ids}), dtype=torch.long)
        self._history: deque[int] = deque(maxlen=sampling.penalty_window)
        self.turn_ended = True
        self._position = 0
        self._forced_listen = False
        self._script: ScriptedDecision | None = None
        self._unit_text: list[int] = []

    def begin_unit(self, forced_listen: bool = False, script: ScriptedDecision | None = None) -> None:
        self._position, self._forced_listen, self._script, self._unit_text = 0, forced_listen, script, []

    def choose(self, logits: torch.Tensor) -> Choice:
        """The token at the unit's next position, given the logits there."""
        position = self._position
        self._position += 1
        if self._forced_listen:  # mid-turn, the turn is closed first, so the context stays one the model knows
            return self._chosen(self.ids.listen if self.turn_ended else self.ids.turn_eos, record=False)
        if position == self.sampling.max_positions - 1:
            return self._chosen(self.ids.chunk_eos, record=False)
        logits = self._scripted(logits.float(), position)
        token = self._sample(logits)
        if token == self.ids.listen and not self.turn_ended:
            token = self.ids.tts_bos
        is_text = token not in self.ids.terminators and token != self.ids.speak
        if is_text and len(self._decode_text([*self._unit_text, token])) >= self.sampling.max_text_chars:
            return self._chosen(self.ids.chunk_eos, record=False)
        return self._chosen(token, record=True)

    def _chosen(self, token: int, record: bool) -> Choice:
        ends = token in self.ids.terminators
        if record:
            self._history.append(token)
        if not ends:
            self.turn_ended = token == self.ids.turn_eos
            if token != self.ids.speak:
                self._unit_text.append(token)
        return Choice(token, ends, not ends and token != self.ids.speak)

    def _sample(self, logits: torch.Tensor) -> int:
        greedy = self.sampling.temperature <= 0
        raw = int(logits.argmax()) if greedy else int(torch.multinomial(torch.softmax(logits, -1), 1,
                                                                        generator=self._generator))
        if raw == self.ids.chunk_eos:
            return raw
        logits = logits.clone()
        logits[self._forbidden] = float("-inf")
        if self._history:
            recent = torch.tensor(sorted(set(self._history)), dtype=torch.long)
            logits[recent] = logits[recent] / self.sampling.repetition_penalty
        turn_eos = logits[self.ids.turn_eos]
        penalty = self.sampling.turn_eos_penalty
        logits[self.ids.turn_eos] = turn_eos / penalty if turn_eos > 0 else turn_eos * penalty
        if greedy:
            return int(logits.argmax())
        return self._top_k_top_p(logits / self.sampling.temperature)

    def _top_k_top_p(self, logits: torch.Tensor) -> int:
        values, indices = logits.topk(self.sampling.top_k)
        probabilities = torch.softmax(values, -1)
        keep = torch.cumsum(probabilities, -1) - probabilities < self.sampling.top_p  # the smallest set reaching p
        probabilities = probabilities * keep
        return int(indices[torch.multinomial(probabilities / probabilities.sum(), 1, generator=self._generator)])

    def _scripted(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        """The test-only decision script as a logit mask (the raw and the processed draw see it)."""
        if self._script is None:
            return logits
        allowed: int | None = None
        if self._script == "listen":
            allowed = self.ids.listen
        elif self._script == "speak_end" and position == SPEAK_END_TEXT_TOKENS:
            allowed = self.ids.turn_eos
        elif self._script == "speak_end" and position > SPEAK_END_TEXT_TOKENS:
            allowed = self.ids.listen
        if allowed is not None:
            only = torch.full_like(logits, float("-inf"))
            only[allowed] = 0.0
            return only
        blocked = logits.clone()
        blocked[[*self.ids.terminators, self.ids.turn_eos]] = float("-inf")
        return blocked
