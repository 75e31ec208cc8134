"""What `/v1/chat/completions` answers: a whole `chat.completion`, or `chat.completion.chunk`s
sent as server-sent events (docs/chat-completions.md). Builders only; the values come from
the session layer."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DONE_EVENT = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class CompletionHeader:
    """What every object of one completion repeats."""

    id: str
    created: int
    model: str


@dataclass(frozen=True)
class TokenCounts:
    prompt: int
    prompt_audio: int
    prompt_images: int
    text: int
    audio: int
    cached: int = 0  # of prompt: served from the prefix cache


def usage_object(counts: TokenCounts) -> dict[str, Any]:
    completion = counts.text + counts.audio
    return {"prompt_tokens": counts.prompt, "completion_tokens": completion, "total_tokens": counts.prompt + completion,
            "prompt_tokens_details": {"cached_tokens": counts.cached, "audio_tokens": counts.prompt_audio,
                                      "image_tokens": counts.prompt_images,
                                      "text_tokens": counts.prompt - counts.prompt_audio - counts.prompt_images},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": counts.audio,
                                          "text_tokens": counts.text, "accepted_prediction_tokens": 0,
                                          "rejected_prediction_tokens": 0}}


def tool_call_object(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def completion_object(header: CompletionHeader, message: dict[str, Any], finish_reason: str,
                      usage: dict[str, Any]) -> dict[str, Any]:
    """A whole answer; `message` as built by `assistant_message`."""
    return {"id": header.id, "object": "chat.completion", "created": header.created, "model": header.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
            "usage": usage, "service_tier": "default", "system_fingerprint": None}


def assistant_message(text: str, audio: dict[str, Any] | None, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    """With audio, the text is the audio's transcript and `content` is null (as OpenAI)."""
    message: dict[str, Any] = {"role": "assistant", "content": None if audio is not None else text, "refusal": None,
                               "annotations": []}
    if audio is not None:
        message["audio"] = audio
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def chunk(header: CompletionHeader, delta: dict[str, Any] | None = None, *, finish_reason: str | None = None,
          usage: dict[str, Any] | None = None, with_usage: bool = False) -> dict[str, Any]:
    """One streamed piece. `delta` None with `usage`: the usage chunk (no choices). When the
    client asked for usage, every other chunk carries `usage: null` (`with_usage`)."""
    body: dict[str, Any] = {"id": header.id, "object": "chat.completion.chunk", "created": header.created,
                            "model": header.model, "service_tier": "default", "system_fingerprint": None}
    if delta is None and usage is not None:
        return {**body, "choices": [], "usage": usage}
    body["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason, "logprobs": None}]
    if with_usage:
        body["usage"] = None
    return body


def sse_event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()
