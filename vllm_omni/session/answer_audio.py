"""Spoken answers a later chat request may refer to by `audio.id` (docs/chat-completions.md).

OpenAI lets a multi-turn conversation name an earlier assistant answer by its audio id
instead of sending it again. The model only needs what was said, so the transcript is kept,
until the id expires (`expires_at`, sent with the answer) or the store is full (oldest go
first).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

DEFAULT_TTL_S = 3600.0
DEFAULT_MAX_ANSWERS = 10_000


class AnswerAudioStore:
    def __init__(self, ttl_s: float = DEFAULT_TTL_S, max_answers: int = DEFAULT_MAX_ANSWERS):
        self.ttl_s, self.max_answers = ttl_s, max_answers
        self._answers: OrderedDict[str, tuple[str, float]] = OrderedDict()  # id -> (transcript, expires at)
        self._lock = threading.Lock()  # requests' messages are read in worker threads

    def expires_at(self) -> int:
        """When an answer kept now expires (Unix seconds)."""
        return int(time.time() + self.ttl_s)

    def keep(self, audio_id: str, transcript: str, expires_at: int) -> None:
        with self._lock:
            self._answers[audio_id] = (transcript, expires_at)
            while len(self._answers) > self.max_answers:
                self._answers.popitem(last=False)

    def transcript(self, audio_id: str) -> str | None:
        """What the answer said; None once it has expired or was never given."""
        with self._lock:
            kept = self._answers.get(audio_id)
            if kept is None:
                return None
            if kept[1] < time.time():
                del self._answers[audio_id]
                return None
            return kept[0]
