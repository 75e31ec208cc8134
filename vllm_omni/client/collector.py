"""What a session received, per response: audio bytes, transcript, errors, receive times."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_omni.client.timing import TEXT_DELTAS, audio_payload, audio_rate
from vllm_omni.protocol.server_event_types import ERROR, OUTPUT_AUDIO_DELTA, RESPONSE_DONE


@dataclass
class ResponseRecord:
    response_id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    audio: bytearray = field(default_factory=bytearray)
    transcript: str = ""
    sample_rate: int = 24000
    status: str | None = None  # from response.done

    @property
    def audio_ms(self) -> int:
        return len(self.audio) * 1000 // (self.sample_rate * 2)


@dataclass
class Collected:
    responses: dict[str, ResponseRecord]  # in order of appearance
    errors: list[dict[str, Any]]


def collect(events: Sequence[dict[str, Any]]) -> Collected:
    """Sort received events by response id (events without one are not response events)."""
    responses: dict[str, ResponseRecord] = {}
    errors = [e for e in events if e.get("type") == ERROR]
    for event in events:
        response_id = event.get("response_id") or (event.get("response") or {}).get("id")
        if not isinstance(response_id, str):
            continue
        record = responses.setdefault(response_id, ResponseRecord(response_id))
        record.events.append(event)
        kind = event.get("type")
        if kind == OUTPUT_AUDIO_DELTA:
            record.audio += audio_payload(event)
            rate = audio_rate(event)
            if rate is not None:
                record.sample_rate = int(rate)
        elif kind in TEXT_DELTAS and isinstance(event.get("delta"), str):
            record.transcript += event["delta"]
        elif kind == RESPONSE_DONE:
            record.status = (event.get("response") or {}).get("status")
    return Collected(responses, errors)
