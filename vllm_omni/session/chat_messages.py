"""Chat-completion messages as the engine's conversation turns (docs/chat-completions.md).

A user message becomes one turn: its images, then its audio (at most one `input_audio`
part: a WAV file, or raw 24 kHz PCM16 as on the realtime API), then its text parts joined
by newlines. An assistant message that refers to an earlier answer's audio by id becomes
that answer's transcript. Every problem names the part it is in.
"""

from __future__ import annotations

import numpy as np

from vllm_omni.audio.formats import AudioFormat as WireFormat
from vllm_omni.audio.formats import decode_base64, decode_to_model_rate
from vllm_omni.audio.pcm import MODEL_RATE, AudioDataError, read_wav, resample
from vllm_omni.engine.request import Message, ToolCall
from vllm_omni.protocol.chat_completions import (
    INPUT_AUDIO_FORMATS,
    AssistantMessage,
    ChatMessage,
    ChatRequestError,
    InputAudio,
    InputAudioPart,
    SystemMessage,
    TextPart,
    ToolMessage,
    UserMessage,
)
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.images import image_from_data_url
from vllm_omni.session.answer_audio import AnswerAudioStore

PCM16_INPUT_RATE = 24000  # raw pcm16 input, as the realtime API's default


def _text(content: str | list[TextPart] | None) -> str | None:
    if content is None or isinstance(content, str):
        return content
    return "\n".join(part.text for part in content)


def input_audio_samples(audio: InputAudio, where: str) -> np.ndarray:
    """16 kHz mono float32 samples of an `input_audio` part."""
    if audio.format not in INPUT_AUDIO_FORMATS:
        raise ChatRequestError(f"input_audio.format {audio.format!r} is not supported: use "
                               f"{' or '.join(INPUT_AUDIO_FORMATS)}.", f"{where}.format", "unsupported_value")
    try:
        data = decode_base64(audio.data)
        if audio.format == "wav":
            samples, rate = read_wav(data)
            samples = resample(samples, rate, MODEL_RATE)
        else:
            samples = decode_to_model_rate(data, WireFormat("pcm16", PCM16_INPUT_RATE))
    except AudioDataError as exc:
        raise ChatRequestError(f"{where}.data: {exc}.", f"{where}.data") from None
    if samples.size == 0:
        raise ChatRequestError(f"{where}.data holds no audio samples.", f"{where}.data")
    return samples


def user_turn(message: UserMessage, where: str) -> Message:
    if isinstance(message.content, str):
        return Message("user", text=message.content)
    turn = Message("user")
    texts = []
    for j, part in enumerate(message.content):
        at = f"{where}.content[{j}]"
        if isinstance(part, TextPart):
            texts.append(part.text)
        elif isinstance(part, InputAudioPart):
            if turn.audio is not None:
                raise ChatRequestError("A user message may carry one input_audio part; send more audio as "
                                       "further user messages.", at)
            turn.audio = input_audio_samples(part.input_audio, f"{at}.input_audio")
        else:
            try:
                turn.images.append(image_from_data_url(part.image_url.url, f"{at}.image_url.url"))
            except ProtocolError as problem:
                raise ChatRequestError(f"{problem.param}: {problem.message}.", problem.param) from None
    turn.text = "\n".join(texts) or None
    return turn


def assistant_turn(message: AssistantMessage, where: str, answers: AnswerAudioStore) -> Message:
    text = _text(message.content)
    if not text and message.audio is not None:
        text = answers.transcript(message.audio.id)
        if text is None:
            raise ChatRequestError(f"No audio with id {message.audio.id!r}: an answer's audio can be referred to "
                                   f"until its expires_at ({answers.ttl_s:.0f} s).", f"{where}.audio.id")
    calls = [ToolCall(call.id, call.function.name, call.function.arguments) for call in message.tool_calls or ()]
    if not text and not calls:
        raise ChatRequestError("An assistant message needs content, audio or tool_calls.", f"{where}.content")
    return Message("assistant", text=text, tool_calls=calls)


def engine_messages(messages: list[ChatMessage], answers: AnswerAudioStore) -> list[Message]:
    turns = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(message, SystemMessage):
            turns.append(Message("system", text=_text(message.content)))
        elif isinstance(message, UserMessage):
            turns.append(user_turn(message, where))
        elif isinstance(message, AssistantMessage):
            turns.append(assistant_turn(message, where, answers))
        elif isinstance(message, ToolMessage):
            turns.append(Message("tool", text=_text(message.content), tool_call_id=message.tool_call_id))
    return turns
