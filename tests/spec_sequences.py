"""Wire-order checkers for recorded realtime event lists (docs/realtime-api.md, the commit fan-out
and response sequences): C(X) for each committed user item, R(r) for each response, and the
native-unit invariants. Each returns nothing and raises AssertionError naming the broken rule."""

from __future__ import annotations

import base64
from typing import Any

Event = dict[str, Any]

COMMIT_ORDER = ["input_audio_buffer.speech_stopped", "conversation.item.added", "conversation.item.created",
                "input_audio_buffer.committed", "conversation.item.input_audio_transcription.completed",
                "conversation.item.done"]
PREFIX = ["response.created", "conversation.item.added", "conversation.item.created", "response.output_item.added"]
BODY = {"response.content_part.added", "response.speak", "response.output_audio.delta",
        "response.output_audio_transcript.delta", "response.output_text.delta",
        "response.function_call_arguments.delta"}
TAIL = ["response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
        "response.output_text.done", "response.content_part.done", "response.function_call_arguments.done",
        "response.output_item.done", "conversation.item.done", "response.done"]


def _item_id(event: Event) -> str | None:
    return event.get("item", {}).get("id") if isinstance(event.get("item"), dict) else event.get("item_id")


def response_ids(events: list[Event]) -> list[str]:
    return [e["response"]["id"] for e in events if e["type"] == "response.created"]


def committed_item_ids(events: list[Event]) -> list[str]:
    return [e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed"]


def check_commit(events: list[Event], item_id: str) -> None:
    """C(X): the events about user item X come in the fan-out order, each once."""
    mine = [e for e in events if e["type"] in COMMIT_ORDER and _item_id(e) == item_id]
    kinds = [e["type"] for e in mine]
    assert kinds == [k for k in COMMIT_ORDER if k in kinds], f"C({item_id}) order: {kinds}"
    assert len(kinds) == len(set(kinds)), f"C({item_id}) repeats: {kinds}"
    for required in COMMIT_ORDER[1:4] + COMMIT_ORDER[5:]:
        assert required in kinds, f"C({item_id}) lacks {required}: {kinds}"
    added, created = (next(e for e in mine if e["type"] == k) for k in COMMIT_ORDER[1:3])
    envelope = ("type", "event_id", "server_event_seq", "_t")  # _t: the client's receive time
    same = tuple({k: v for k, v in e.items() if k not in envelope} for e in (created, added))
    assert same[0] == same[1], f"C({item_id}) created is not the added payload: {same}"
    assert added["item"]["role"] == "user" and added["item"]["status"] == "completed"


UNSEQUENCED = {"output_audio_buffer.cleared", "overlap.decision", "response.listen", "playback.acknowledged"}


def _belongs(event: Event, response_id: str) -> bool:
    """Whether `event` is one of R(response_id)'s own (events naming it from outside do not count)."""
    if event["type"] in UNSEQUENCED:
        return False
    if event.get("response_id") == response_id:
        return True
    if event["type"] in ("response.created", "response.done"):
        return event["response"]["id"] == response_id
    return event["type"].startswith("conversation.item.") and _item_id(event) == f"item_{response_id}"


def check_response(events: list[Event], response_id: str, lane: str = "G") -> None:
    """R(r): prefix, body, then the `*.done` block in order, each `*.done` for what was opened,
    `response.done` exactly once and immediately followed by `rate_limits.updated`; on the native
    lane (`N`) each audio delta with its transcript delta."""
    positions = [i for i, e in enumerate(events) if _belongs(e, response_id)]
    mine = [events[i] for i in positions]
    kinds = [e["type"] for e in mine]
    assert kinds[:4] == PREFIX, f"R({response_id}) prefix: {kinds[:6]}"
    assert kinds.count("response.done") == 1 and kinds[-1] == "response.done", f"R({response_id}) end: {kinds[-4:]}"
    after = positions[-1] + 1
    assert after < len(events) and events[after]["type"] == "rate_limits.updated", f"R({response_id}) rate limits"
    assert events[after]["rate_limits"] == []
    body_end = next(i for i, k in enumerate(kinds) if i >= 4 and k not in BODY)
    assert all(k in BODY for k in kinds[4:body_end])
    tail = kinds[body_end:]
    cursor = 0
    for kind in tail:
        assert kind in TAIL[cursor:], f"R({response_id}) tail order: {tail}"
        cursor = TAIL.index(kind, cursor) + 1
    body = mine[4:body_end]
    audio = [e for e in body if e["type"] == "response.output_audio.delta"]
    said = "".join(e["delta"] for e in body if e["type"] == "response.output_audio_transcript.delta")
    text = "".join(e["delta"] for e in body if e["type"] == "response.output_text.delta")
    parts = [e["part"]["type"] for e in body if e["type"] == "response.content_part.added"]
    assert ("response.output_audio.done" in tail) == bool(audio or said), f"R({response_id}) audio done: {tail}"
    assert ("response.output_audio_transcript.done" in tail) == bool(said), f"R({response_id}) transcript done"
    if said:
        done = next(e for e in mine if e["type"] == "response.output_audio_transcript.done")
        assert done["transcript"] == said
    if text:
        assert next(e for e in mine if e["type"] == "response.output_text.done")["text"] == text
        first = next(i for i, e in enumerate(body) if e["type"] == "response.output_text.delta")
        assert body[first - 1]["type"] == "response.content_part.added" and body[first - 1]["part"]["type"] == "text"
    assert tail.count("response.content_part.done") == len(parts), f"R({response_id}) parts {parts}: {tail}"
    if "response.speak" in kinds:
        assert kinds.count("response.speak") == 1
        if audio:
            assert kinds.index("response.speak") < kinds.index("response.output_audio.delta")
    if lane == "N":
        check_transcript_pairs(body)
    _check_addressing(mine, response_id)


def check_transcript_pairs(events: list[Event]) -> None:
    """Duplex lane: every audio delta is followed by exactly one transcript delta."""
    body = [e for e in events if e["type"] in BODY]
    for i, event in enumerate(body):
        if event["type"] == "response.output_audio.delta":
            assert i + 1 < len(body) and body[i + 1]["type"] == "response.output_audio_transcript.delta", \
                [e["type"] for e in body[i:i + 3]]


def _check_addressing(mine: list[Event], response_id: str) -> None:
    """One assistant item `item_<r>`, output_index 0, audio part 0 and text part after it."""
    has_audio_part = any(e["type"] == "response.content_part.added" and e["part"]["type"] == "audio" for e in mine)
    for event in mine:
        if "item_id" in event and not event["type"].startswith("conversation.item"):
            assert event["item_id"] == f"item_{response_id}", event["type"]
        if "output_index" in event:
            assert event["output_index"] == 0
        if "content_index" in event:
            text_kind = "text" in event["type"] or event.get("part", {}).get("type") == "text"
            assert event["content_index"] == (1 if text_kind and has_audio_part else 0), event["type"]
        if event["type"] == "response.output_audio.delta":
            base64.b64decode(event["delta"], validate=True)


def check_recording(events: list[Event], lane: str = "G") -> None:
    """Every committed item and every response of a recorded connection obeys C(X) and R(r)."""
    assert not [e for e in events if e["type"] == "error"], [e for e in events if e["type"] == "error"]
    for item_id in committed_item_ids(events):
        check_commit(events, item_id)
    ids = response_ids(events)
    assert len(ids) == len(set(ids)), "response ids repeat"
    for response_id in ids:
        check_response(events, response_id, lane)
    done_at = {e["response"]["id"]: i for i, e in enumerate(events) if e["type"] == "response.done"}
    for response_id, end in done_at.items():  # nothing of a response after its response.done
        assert not any(_belongs(e, response_id) for e in events[end + 1:]), response_id


def check_native_units(events: list[Event]) -> None:
    """The native-unit invariants: one active response at a time, and a listen naming a response
    ends it (its response.done follows)."""
    active: str | None = None
    for i, event in enumerate(events):
        if event["type"] == "response.created":
            assert active is None, f"response {event['response']['id']} opened while {active} is active"
            active = event["response"]["id"]
        elif event["type"] == "response.done":
            active = None
        elif event["type"] == "response.listen" and "response_id" in event:
            assert any(e["type"] == "response.done" and e["response"]["id"] == event["response_id"]
                       for e in events[i + 1:]), event
