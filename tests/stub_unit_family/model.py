"""A unit model with 80 ms units (Moshi's frame rate) that decides by the loudness it hears:
it listens while the user speaks; after SPEECH_UNITS loud units and then a quiet one it
speaks ANSWER_UNITS units (a word and 80 ms of tone each), the last ending its turn. A forced
listen ends a turn it is speaking. Deterministic, so a session's events are exact."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vllm_omni.audio.pcm import MODEL_RATE, float_to_pcm16_bytes
from vllm_omni.engine.native_duplex import DuplexOpening, UnitDecision

UNIT_MS = 80
UNIT_SAMPLES = MODEL_RATE * UNIT_MS // 1000
OUTPUT_RATE = 24000
LOUD_RMS = 0.05
SPEECH_UNITS = 3  # loud units that make a user turn
ANSWER_UNITS = 5


def answer_word(index: int) -> str:
    return f"w{index} "


def answer_audio(index: int) -> bytes:
    t = np.arange(OUTPUT_RATE * UNIT_MS // 1000) / OUTPUT_RATE
    return float_to_pcm16_bytes(0.2 * np.sin(2 * np.pi * (300 + 50 * index) * t))


class StubUnitSession:
    def __init__(self, opening: DuplexOpening):
        self._opening = opening
        self._received = 0
        self._pending = np.zeros(0, np.float32)
        self._loud_units = 0
        self._speaking: int | None = None  # the next answer unit's index while it speaks
        self.closed = False

    async def append(self, samples: np.ndarray, frame_groups: Sequence[Sequence[bytes]],
                     force_listen: bool) -> list[UnitDecision]:
        self._received += samples.size
        self._pending = np.concatenate([self._pending, samples])
        decisions = []
        while self._pending.size >= UNIT_SAMPLES:
            unit, self._pending = self._pending[:UNIT_SAMPLES], self._pending[UNIT_SAMPLES:]
            decisions.append(self._decide(float(np.sqrt(np.mean(unit ** 2))), force_listen))
        return decisions

    def _decide(self, rms: float, force_listen: bool) -> UnitDecision:
        if force_listen:
            self._speaking, self._loud_units = None, 0
            return UnitDecision(spoke=False)
        if self._speaking is None:
            if rms >= LOUD_RMS:
                self._loud_units += 1
                return UnitDecision(spoke=False)
            if self._loud_units < SPEECH_UNITS:
                return UnitDecision(spoke=False)
            self._speaking, self._loud_units = 0, 0
        index = self._speaking
        last = index == ANSWER_UNITS - 1
        self._speaking = None if last else index + 1
        audio = answer_audio(index) if self._opening.wants_audio else b""
        return UnitDecision(spoke=True, text=answer_word(index), audio=audio, end_of_turn=last)

    def samples_to_boundary(self) -> int:
        return UNIT_SAMPLES - self._received % UNIT_SAMPLES  # every unit is decided as it closes

    async def close(self) -> None:
        self.closed = True


class StubUnitModel:
    output_sample_rate = OUTPUT_RATE
    unit_ms = first_unit_ms = UNIT_MS
    setting_keys: frozenset[str] = frozenset()  # it reads none of the opening's extra_body
    needs_voice_prompt = False  # its tones are its own voice

    def check_settings(self, settings: Mapping[str, Any]) -> None:
        """No settings of its own."""

    def check_update(self, settings: Mapping[str, Any]) -> None:
        """No settings of its own."""

    @classmethod
    def load(cls, model: str | Path, deploy: Any) -> StubUnitModel:
        return cls()

    async def open(self, opening: DuplexOpening) -> StubUnitSession:
        return StubUnitSession(opening)

    def shutdown(self) -> None:
        """Nothing to release."""
