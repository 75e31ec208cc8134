"""Extensions on request, and the pure-GA view of GA-lane server events (docs/realtime-api.md §1.3, §0.2).

A session builds every server event in its extended shape. A connection that did not ask for
the extensions (`?extensions=vllm_omni`) receives `ga_view(event)` instead: extension events are
dropped, extension fields removed, and values GA spells differently mapped to GA's spelling,
so that every event validates against the OpenAI Realtime GA schema. The SDK's models are the
floor, not the whole wire: what OpenAI's own server sends beyond them (the session object's
`object` and `id`) is sent too.
"""

from __future__ import annotations

from typing import Any

from vllm_omni.protocol import server_event_types as kinds

EXTENSIONS_QUERY = "extensions"  # the WebSocket URL's query parameter
VLLM_OMNI = "vllm_omni"  # the one extension set there is

EXTENSION_EVENTS = frozenset({kinds.SESSION_CLOSED, kinds.SESSION_HEARTBEAT_ACK, kinds.OVERLAP_DECISION,
                              kinds.PLAYBACK_ACKNOWLEDGED})
EXTENSION_FIELDS = {
    kinds.SESSION_CREATED: ("id", "created"),  # the legacy dialect's
    kinds.AUDIO_BUFFER_COMMITTED: ("event",),
    kinds.ITEM_DELETED: ("event",),
    kinds.ITEM_TRUNCATED: ("event",),
    kinds.RESPONSE_CREATED: ("response_id",),
    kinds.RESPONSE_DONE: ("response_id", VLLM_OMNI),
    kinds.OUTPUT_AUDIO_DELTA: (VLLM_OMNI,),
}
ITEM_EVENTS = frozenset({kinds.ITEM_ADDED, kinds.ITEM_CREATED, kinds.ITEM_DONE, kinds.ITEM_RETRIEVED,
                         kinds.OUTPUT_ITEM_ADDED, kinds.OUTPUT_ITEM_DONE})
# GA's session keys, with the `object` and `id` OpenAI's server sends beyond the SDK's model (§2.6)
SESSION_KEYS = ("object", "id", "type", "model", "instructions", "output_modalities", "audio", "max_output_tokens",
                "tools", "tool_choice", "tracing", "include", "prompt")
AUDIO_KEYS = (("input", ("turn_detection", "transcription", "noise_reduction")), ("output", ("voice", "speed")))
SERVER_VAD_KEYS = ("type", "threshold", "prefix_padding_ms", "silence_duration_ms", "create_response",
                   "interrupt_response", "idle_timeout_ms")
SEMANTIC_VAD_KEYS = ("type", "eagerness", "create_response", "interrupt_response")
GA_RATES = {"audio/pcm": 24000, "audio/pcmu": 8000, "audio/pcma": 8000}  # the only rate GA has for each
GA_CANCEL_REASONS = frozenset({"turn_detected", "client_cancelled"})


def wants_extensions(query_value: str | None) -> bool:
    """Whether an `extensions` query value (a comma-separated list of names) asks for ours."""
    return query_value is not None and VLLM_OMNI in (name.strip() for name in query_value.split(","))


def ga_view(event: dict[str, Any]) -> dict[str, Any] | None:
    """`event` as GA defines it; None for an event GA has no counterpart of."""
    kind = event["type"]
    if kind in EXTENSION_EVENTS:
        return None
    if kind == kinds.OUTPUT_AUDIO_BUFFER_CLEARED and event["response_id"] is None:
        return None  # nothing was cleared, and GA's event always names a response
    view = {key: value for key, value in event.items() if key not in EXTENSION_FIELDS.get(kind, ())}
    if kind in (kinds.SESSION_CREATED, kinds.SESSION_UPDATED):
        view["session"] = ga_session(event["session"])
    elif kind in (kinds.RESPONSE_CREATED, kinds.RESPONSE_DONE):
        view["response"] = ga_response(event["response"])
    elif kind in ITEM_EVENTS:
        view["item"] = ga_item(event["item"])
    return view


def ga_modalities(modalities: list[str]) -> list[str]:
    """GA names one output modality: `audio` (audio with its transcript) or `text`."""
    return ["audio"] if "audio" in modalities else ["text"]


def ga_format(fmt: dict[str, Any]) -> dict[str, Any] | None:
    """A GA audio format object, or None where GA cannot express the format (another rate)."""
    if GA_RATES.get(fmt.get("type")) != fmt.get("rate"):
        return None
    return dict(fmt) if fmt["type"] == "audio/pcm" else {"type": fmt["type"]}


def _ms(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def ga_session(session: dict[str, Any]) -> dict[str, Any]:
    """The GA keys of a session object, as OpenAI's server sends them (docs/realtime-api.md §2.6)."""
    view = {key: session[key] for key in SESSION_KEYS if key in session}
    view["output_modalities"] = ga_modalities(session["output_modalities"])
    view["audio"] = {direction: _ga_audio(session["audio"][direction], keys) for direction, keys in AUDIO_KEYS}
    td = view["audio"]["input"]["turn_detection"]
    if td is not None:
        keys = SEMANTIC_VAD_KEYS if td["type"] == "semantic_vad" else SERVER_VAD_KEYS
        view["audio"]["input"]["turn_detection"] = {key: _ms(td[key]) for key in keys if key in td}
    return view


def _ga_audio(settings: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    fmt = ga_format(settings["format"])
    return {**({} if fmt is None else {"format": fmt}), **{key: settings[key] for key in keys}}


def ga_item(item: dict[str, Any]) -> dict[str, Any]:
    """An item without the assistant content's `audio_duration_ms` (function items have no content)."""
    if "content" not in item:
        return item
    content = [{k: v for k, v in part.items() if k != "audio_duration_ms"} for part in item["content"]]
    return {**item, "content": content}


def ga_response(response: dict[str, Any]) -> dict[str, Any]:
    """A response object without `modalities`, its items and status reasons in GA's terms."""
    view = {key: value for key, value in response.items() if key != "modalities"}
    view["output_modalities"] = ga_modalities(response["output_modalities"])
    view["output"] = [ga_item(item) for item in response["output"]]
    view["audio"] = {"output": _ga_audio(response["audio"]["output"], ("voice",))}
    details = response.get("status_details")
    if details is not None:
        details = dict(details)
        if details["type"] == "failed":
            details.pop("reason", None)  # GA reports a failure by its error alone
        elif details["type"] == "cancelled" and details.get("reason") not in GA_CANCEL_REASONS:
            details["reason"] = "client_cancelled"  # input.cancel, output_audio_buffer.clear: the client's
        view["status_details"] = details
    return view
