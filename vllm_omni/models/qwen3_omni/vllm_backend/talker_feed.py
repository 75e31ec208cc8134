"""The trailing text of each talker request, as the thinker produces it.

One copy per process of the talker engine, filled through `collective_rpc("omni_push_texts",
...)`: the workers' copy gives each decode step its text row (the model), the EngineCore's
copy (filed by `vllm_talker_gate.TalkerExecutor`) tells the scheduler whether a request's
next decode step may run yet. Keys are the orchestrator's request ids; vLLM's internal ids
add a `-<8 chars>` suffix (see `holding_scheduler.external_request_id`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

# Talker sampling fields the model applies itself travel in vLLM's SamplingParams.extra_args.
REPETITION_PENALTY_KEY = "omni_repetition_penalty"
IGNORE_EOS_KEY = "omni_ignore_eos"
# So do the prompt's M-RoPE positions where they are not sequential (images in the user
# turns, talker_bridge.py): the t/h/w rows [3][P], and the rope delta of every later position.
MROPE_POSITIONS_KEY = "omni_mrope_positions"
ROPE_DELTA_KEY = "omni_rope_delta"


@dataclass
class _Text:
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False


class TextFeed:
    def __init__(self) -> None:
        self._texts: dict[str, _Text] = {}
        self._lock = threading.Lock()

    def push(self, request_id: str, token_ids: list[int], finished: bool) -> None:
        with self._lock:
            text = self._texts.setdefault(request_id, _Text())
            text.token_ids.extend(token_ids)
            text.finished = text.finished or finished

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._texts.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._texts)

    def token_for_step(self, request_id: str, step: int, tts_eos_id: int, tts_pad_id: int) -> int | None:
        """The thinker token whose projection is decode step `step`'s text row: the fed-back
        tokens in order, then tts_eos once the thinker finished, then tts_pad; None while
        the thinker has not produced it yet."""
        with self._lock:
            text = self._texts.get(request_id)
            if text is None:
                return None
            if step < len(text.token_ids):
                return text.token_ids[step]
            if not text.finished:
                return None
            return tts_eos_id if step == len(text.token_ids) else tts_pad_id

    def ready(self, request_id: str, step: int) -> bool:
        return self.token_for_step(request_id, step, 0, 0) is not None


TEXT_FEED = TextFeed()
