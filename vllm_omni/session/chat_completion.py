"""One `/v1/chat/completions` request: its engine request, and its answer as one
`chat.completion` or as a stream of chunks (docs/chat-completions.md).

`start` submits the request and waits for its first output, so a refusal (bad input, a busy
engine, a dead stage) is still an HTTP error; `chunks` or `complete` then read the rest.
Every read has the request's deadline, and `close` stops the engine request however the
caller ends (a client that went away, a timeout, an error).
"""

from __future__ import annotations

import asyncio
import base64
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from vllm_omni.audio.formats import AudioFormat, encode_output
from vllm_omni.engine.interface import EngineClient
from vllm_omni.engine.request import (
    AudioChunk,
    EngineBusyError,
    EngineOutput,
    FinishReason,
    Message,
    OmniRequest,
    RequestError,
    RequestFinished,
    StageUnavailableError,
    TextDelta,
    ToolCall,
)
from vllm_omni.metrics import prometheus as metrics
from vllm_omni.protocol.chat_completions import ChatCompletionRequest, ChatRequestError, error_body
from vllm_omni.protocol.chat_responses import (
    CompletionHeader,
    TokenCounts,
    assistant_message,
    chunk,
    completion_object,
    tool_call_object,
    usage_object,
)
from vllm_omni.protocol.server_events import new_id
from vllm_omni.session.answer_audio import AnswerAudioStore

ENDPOINT = "chat_completions"  # the metrics' label
FIELD_PATH = re.compile(r"^[A-Za-z_][\w.\[\]]*$")  # an engine message's leading `field.path: …`


def refusal(exc: RequestError) -> ChatRequestError:
    """The engine's refusal as the HTTP error a client gets."""
    if isinstance(exc, EngineBusyError):
        return ChatRequestError(str(exc), None, "rate_limit_exceeded", 429)
    if isinstance(exc, StageUnavailableError):
        return ChatRequestError(str(exc), None, exc.code, 503)
    field = str(exc).split(": ", 1)[0]
    return ChatRequestError(str(exc), field if FIELD_PATH.match(field) else None)


def failure(final: RequestFinished) -> ChatRequestError:
    """An answer the engine could not finish."""
    unavailable = final.error_code == StageUnavailableError.code
    return ChatRequestError(f"the answer failed: {final.error}", None, final.error_code or "engine_error",
                            503 if unavailable else 500)


class ChatCompletion:
    def __init__(self, engine: EngineClient, request: ChatCompletionRequest, messages: list[Message],
                 answers: AnswerAudioStore, timeout_s: float):
        """`messages`: the request's, as `engine_messages` makes them."""
        self.engine, self.request, self.answers = engine, request, answers
        self.header = CompletionHeader(new_id("chatcmpl-"), int(time.time()), request.model)
        self.audio_id = new_id("audio_") if request.wants_audio else None
        self.expires_at = answers.expires_at()
        self.engine_request = OmniRequest(
            messages=messages, speaker=self._speaker(),
            modalities=("text", "audio") if request.wants_audio else ("text",),
            max_output_tokens=request.token_limit, temperature=request.temperature, top_p=request.top_p,
            stop=request.stop_strings, seed=request.seed, tools=self._tools(), tool_choice=self._tool_choice(),
            affinity_key=request.prompt_cache_key)
        self._deadline = asyncio.get_running_loop().time() + timeout_s
        self._timeout_s = timeout_s
        self._stream: AsyncIterator[EngineOutput] | None = None
        self._first: EngineOutput | None = None
        self._started_at = time.monotonic()
        self._first_text = self._first_audio = True

    def _speaker(self) -> str | None:
        """The voice asked for if the model has it; any other name (OpenAI's `alloy`…) gets the
        model's default voice, as on the realtime API."""
        voice = self.request.audio.voice.lower() if self.request.audio is not None else None
        return voice if voice in self.engine.speakers else None

    def _tools(self) -> list[dict[str, Any]]:
        return [tool.function.model_dump(exclude_none=True, exclude={"strict"}) for tool in self.request.tools or ()]

    def _tool_choice(self) -> str:
        choice = self.request.tool_choice or "auto"
        return choice if isinstance(choice, str) else choice.function.name

    # Reading the engine -----------------------------------------------------------------

    async def start(self) -> None:
        """Submit the request; raises ChatRequestError if the engine refuses it."""
        self._stream = self._timed(self.engine.generate(self.engine_request))
        try:
            self._first = await self._next()
        except RequestError as exc:
            raise refusal(exc) from None

    async def close(self) -> None:
        """Stop the engine request if it still runs (the engine aborts it at once). The caller
        calls this however the request ends."""
        if self._stream is not None:
            await self._stream.aclose()

    async def _next(self) -> EngineOutput:
        try:
            async with asyncio.timeout_at(self._deadline):
                return await anext(self._stream)
        except TimeoutError:
            raise ChatRequestError(f"the answer took longer than {self._timeout_s:.0f} s", None, "timeout",
                                   504) from None

    async def _outputs(self) -> AsyncIterator[EngineOutput]:
        """Every output once, the first (read by `start`) included, up to the final record."""
        output = self._first
        while True:
            yield output
            if isinstance(output, RequestFinished):
                return
            output = await self._next()

    async def _timed(self, stream: AsyncIterator[EngineOutput]) -> AsyncIterator[EngineOutput]:
        """The engine's outputs, observing time to first text and first audio; closing it
        closes the engine's stream (which aborts the request if it still runs)."""
        try:
            async for output in stream:
                if isinstance(output, TextDelta) and self._first_text:
                    self._first_text = False
                    metrics.HTTP_TTFT.labels(endpoint=ENDPOINT).observe(time.monotonic() - self._started_at)
                if isinstance(output, AudioChunk) and self._first_audio:
                    self._first_audio = False
                    metrics.HTTP_TTFP.labels(endpoint=ENDPOINT).observe(time.monotonic() - self._started_at)
                yield output
        finally:
            await stream.aclose()

    # The answer -----------------------------------------------------------------------------

    def _finish_reason(self, final: RequestFinished) -> str:
        if final.tool_calls:
            return "tool_calls"
        return "length" if final.finish_reason is FinishReason.LENGTH else "stop"

    def _usage(self, final: RequestFinished) -> dict[str, Any]:
        usage = final.usage
        return usage_object(TokenCounts(usage.prompt_tokens, usage.input_audio_tokens, usage.image_tokens,
                                        usage.text_tokens, usage.audio_tokens, usage.cached_tokens))

    def _keep_answer(self, final: RequestFinished) -> None:
        if self.audio_id is not None:
            self.answers.keep(self.audio_id, final.text, self.expires_at)

    async def complete(self) -> dict[str, Any]:
        """The whole answer as one `chat.completion`; raises ChatRequestError if it failed."""
        pcm, rate, calls = bytearray(), 0, []
        async for output in self._outputs():
            if isinstance(output, AudioChunk):
                pcm += output.pcm16
                rate = output.sample_rate
            elif isinstance(output, ToolCall):
                calls.append(tool_call_object(output.call_id, output.name, output.arguments))
        final = output
        if final.finish_reason is FinishReason.ERROR:
            raise failure(final)
        self._keep_answer(final)
        audio = None
        if self.audio_id is not None:
            rate = rate or self.engine.output_sample_rate
            data, _ = encode_output(bytes(pcm), rate, AudioFormat(self.request.audio.format, rate))
            audio = {"id": self.audio_id, "data": base64.b64encode(data).decode(), "expires_at": self.expires_at,
                     "transcript": final.text}
        return completion_object(self.header, assistant_message(final.text, audio, calls),
                                 self._finish_reason(final), self._usage(final))

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """The answer as `chat.completion.chunk` objects, as the engine produces it; a failure
        after the first chunk is an `{"error": …}` object, the last thing sent."""
        with_usage = self.request.stream_options is not None and self.request.stream_options.include_usage

        def piece(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return chunk(self.header, delta, finish_reason=finish_reason, with_usage=with_usage)

        yield piece({"role": "assistant", "content": None if self.audio_id else ""})
        audio_head = {"id": self.audio_id, "expires_at": self.expires_at}
        calls = 0
        try:
            async for output in self._outputs():
                if isinstance(output, TextDelta):
                    yield piece({"audio": {**audio_head, "transcript": output.text}} if self.audio_id
                                else {"content": output.text})
                elif isinstance(output, AudioChunk):
                    yield piece({"audio": {**audio_head, "data": base64.b64encode(output.pcm16).decode()}})
                elif isinstance(output, ToolCall):
                    call = tool_call_object(output.call_id, output.name, output.arguments)
                    yield piece({"tool_calls": [{"index": calls, **call}]})
                    calls += 1
        except ChatRequestError as problem:  # the deadline passed
            yield error_body(problem, "server_error")
            return
        final = output
        if final.finish_reason is FinishReason.ERROR:
            yield error_body(failure(final), "server_error")
            return
        self._keep_answer(final)
        yield piece({}, finish_reason=self._finish_reason(final))
        if with_usage:
            yield chunk(self.header, usage=self._usage(final))
