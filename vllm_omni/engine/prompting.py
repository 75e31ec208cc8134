"""A request's conversation as chat-template messages, fitted to what the first stage takes.

Messages become the Hugging Face chat-template shape (content parts of type 'text' and
'audio') plus the audio features of each turn; the family renders them. When the
conversation holds more audio items than the text stage's `limit_mm_per_prompt`, the oldest
turns lose their audio; when it outgrows the context, the oldest turns are left out (system
instructions and the current turn always stay).
"""

from __future__ import annotations

from typing import Any

from vllm_omni.audio.pcm import validate_model_audio
from vllm_omni.engine.family import ModelFamily, Prompt
from vllm_omni.engine.request import Message, RequestError

Turn = tuple[dict[str, Any], Any]  # (chat-template message, its audio features or None)


def render_conversation(family: ModelFamily, messages: list[Message], tools: list[dict[str, Any]] = (),
                        call_tool: bool = False) -> Prompt:
    """`tools` are offered in the prompt; `call_tool` makes the prompt open a tool call."""
    turns = [chat_turn(family, message, f"messages[{i}]") for i, message in enumerate(messages)]
    if not turns or turns[-1][0]["role"] not in ("user", "tool"):
        raise RequestError("messages: the last turn must be the user's (or a tool result)")
    fit_audio_limit(turns, family.deploy.stage_by_role(family.text_role).engine_args.mm_limit("audio"),
                    family.text_role)
    while True:
        prompt = family.render([m for m, _ in turns], [f for _, f in turns if f is not None], tools, call_tool)
        if len(prompt) < family.max_model_len:
            return prompt
        oldest = next((i for i, (m, _) in enumerate(turns[:-1]) if m["role"] != "system"), None)
        if oldest is None:
            raise RequestError(f"prompt is {len(prompt)} tokens; the model's context is {family.max_model_len}")
        del turns[oldest]


def fit_audio_limit(turns: list[Turn], limit: int, stage: str) -> None:
    """Keep at most `limit` audio items (vLLM refuses more; the torch backend keeps the same
    limit): the oldest turns with audio lose it, and a turn left without text goes. Each turn
    carries at most one audio item."""
    while sum(features is not None for _, features in turns) > limit:
        oldest = next((i for i, (_, f) in enumerate(turns[:-1]) if f is not None), None)
        if oldest is None:
            raise RequestError(f"the current turn carries audio, but the {stage} stage's limit_mm_per_prompt "
                               f"allows {limit} audio items per prompt")
        message, _ = turns[oldest]
        text = [part for part in message["content"] if part["type"] != "audio"]
        if text:
            turns[oldest] = ({**message, "content": text}, None)
        else:
            del turns[oldest]


def chat_turn(family: ModelFamily, message: Message, where: str) -> Turn:
    if message.role not in ("system", "user", "assistant", "tool"):
        raise RequestError(f"{where}.role: expected system, user, assistant or tool, got {message.role!r}")
    if message.role == "tool":
        return {"role": "tool", "content": message.text or "", "tool_call_id": message.tool_call_id}, None
    parts: list[dict[str, Any]] = []
    features = None
    if message.audio is not None or message.audio_stream is not None:
        if message.role != "user":
            raise RequestError(f"{where}: only user turns may carry audio")
        stream = message.audio_stream
        try:
            if stream is None:
                stream = family.audio_stream()
                stream.append(validate_model_audio(message.audio, message.sample_rate, f"{where}.audio"))
            features = stream.close()
        except ValueError as exc:
            source = "audio" if message.audio_stream is None else "audio_stream"
            text = str(exc) if str(exc).startswith(where) else f"{where}.{source}: {exc}"
            raise RequestError(text) from None
        parts.append({"type": "audio"})
    if message.text:
        parts.append({"type": "text", "text": message.text})
    if message.tool_calls and message.role != "assistant":
        raise RequestError(f"{where}: only assistant turns carry tool calls")
    if not parts and not message.tool_calls:
        raise RequestError(f"{where}: has neither text nor audio")
    content = parts[0]["text"] if message.role == "system" and len(parts) == 1 else parts
    turn: dict[str, Any] = {"role": message.role, "content": content}
    if message.tool_calls:
        turn["tool_calls"] = [{"type": "function", "id": call.call_id,
                               "function": {"name": call.name, "arguments": call.arguments}}
                              for call in message.tool_calls]
    return turn, features
