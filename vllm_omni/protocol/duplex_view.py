"""The duplex lane's spelling of server events (docs/realtime-api.md §13, §13.3).

Sessions build their events in the GA lane's extended shape, errors with GA's codes; the duplex
lane keeps the reference vocabulary and field placement its clients (the MiniCPM-o demo
client among them) were written against, so a duplex connection receives
`duplex_view(event)`: the same events, error codes respelled, and the report of audio deltas
and `response.done` also where those clients read it.
"""

from __future__ import annotations

import re
from typing import Any

from vllm_omni.protocol import server_event_types as kinds
from vllm_omni.protocol.ga_view import VLLM_OMNI

DUPLEX_CODES = {
    "input_audio_buffer_commit_empty": "input_audio_buffer_empty",
    "conversation_already_has_active_response": "response_already_active",
    "response_cancel_not_active": "response_not_active",
    "invalid_value": "bad_event",
}
_UNKNOWN_ITEM = re.compile(r"item_[a-z]+_invalid_item_id")
# an audio delta's report keys that the duplex lane also sends in its `metadata` (§13)
DELTA_METADATA_KEYS = ("audio_duration_ms", "audio_text_marks", "playback", "end_of_turn", "session_id")


def duplex_code(code: str, param: str | None) -> str:
    """The duplex lane's code for a GA-lane error code."""
    if _UNKNOWN_ITEM.fullmatch(code):
        return "item_not_found"
    if code == "missing_required_parameter":
        return "missing_item_id" if param == "item_id" else "bad_event"
    return DUPLEX_CODES.get(code, code)


def duplex_view(event: dict[str, Any], *, epoch: int | None = None) -> dict[str, Any]:
    """`event` as the duplex lane spells it; `epoch`: the session's, for the audio deltas' metadata."""
    kind = event["type"]
    if kind == kinds.OUTPUT_AUDIO_DELTA:
        return _audio_delta(event, epoch)
    if kind == kinds.RESPONSE_DONE and VLLM_OMNI in event:
        return _response_done(event)
    if kind != kinds.ERROR or not isinstance(event.get("error"), dict):
        return event
    error = event["error"]
    code = duplex_code(error["code"], error.get("param"))
    return event if code == error["code"] else {**event, "error": {**error, "code": code}}


def _audio_delta(event: dict[str, Any], epoch: int | None) -> dict[str, Any]:
    """Top-level `format` and `sample_rate_hz`, and `metadata` with the cumulative duration,
    playback cursor and turn flags (§13); the `vllm_omni` report stays as it is."""
    report = event[VLLM_OMNI]
    metadata = {key: report[key] for key in DELTA_METADATA_KEYS if key in report}
    metadata["playback"] = dict(metadata["playback"])
    metadata["model_speak"] = True  # every audio delta is the model speaking
    if epoch is not None:
        metadata["epoch"] = epoch
    return {**event, "format": report["format"], "sample_rate_hz": report["sample_rate_hz"], "metadata": metadata}


def _response_done(event: dict[str, Any]) -> dict[str, Any]:
    """The response's `metadata` gains the reserved keys (§13): `vllm_omni.stage_metrics`, the
    final `playback` cursor and `committed`, beside the client's own keys."""
    report = event[VLLM_OMNI]
    response = event["response"]
    metadata = {**(response.get("metadata") or {}), "vllm_omni": {"stage_metrics": report["stage_metrics"]},
                "playback": dict(report["playback"]), "committed": report["committed"]}
    return {**event, "response": {**response, "metadata": metadata}}
