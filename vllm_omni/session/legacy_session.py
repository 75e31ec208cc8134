"""The legacy lane (vLLM transcription-style protocol, docs/realtime-api.md §8.1, §8.2).

Vocabulary in: session.update{model}, input_audio_buffer.append{audio},
input_audio_buffer.commit{final}. Out: transcription.delta / .done,
response.output_audio.delta{audio, format, sample_rate_hz}, response.output_audio.done,
and flat errors. Nothing else is ever sent on this lane.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from vllm_omni.audio.pcm import pcm16_to_float
from vllm_omni.engine.interface import EngineClient
from vllm_omni.engine.request import (
    AudioChunk,
    AudioInputStream,
    FinishReason,
    Message,
    OmniRequest,
    RequestFinished,
    TextDelta,
)
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_events import b64, flat_error
from vllm_omni.protocol.session_config import SessionConfig
from vllm_omni.protocol.states import Lane
from vllm_omni.session.base import Emit, SessionOptions, reporting

logger = logging.getLogger(__name__)

MAX_QUEUED_INPUT_BYTES = 16 * 1024 * 1024  # appends held until a `final:false` commit (as float32)


class LegacySession:
    lane = Lane.LEGACY

    def __init__(self, engine: EngineClient, config: SessionConfig, options: SessionOptions, emit: Emit):
        self.engine = engine
        self.config = config
        self.served_models = options.served_models
        self._emit = emit
        self.default_speaker = options.default_speaker
        self.validated = False
        self._queued: list[np.ndarray] = []  # appends waiting for a `final:false` commit
        self._stream: AudioInputStream | None = None
        self.task: asyncio.Task | None = None
        # The lane's whole vocabulary (no aliases here); events are read as sent, not parsed.
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "session.update": self._on_update,
            "input_audio_buffer.append": self._on_append,
            "input_audio_buffer.commit": self._on_commit,
        }

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def idle_timeout_s(self) -> float:
        return self.config.idle_timeout_s

    def error(self, code: str, message: str) -> None:
        self._emit(flat_error(code, message))

    def report(self, exc: ProtocolError, client_event_id: str | None = None) -> None:
        self.error(exc.code, exc.message)  # the legacy shape carries no event id

    async def handle(self, raw: dict[str, Any]) -> None:
        await reporting(self, raw, self._dispatch(raw))

    async def _dispatch(self, raw: dict[str, Any]) -> None:
        kind = raw.get("type")
        handler = self._handlers.get(kind) if isinstance(kind, str) else None
        if handler is None:
            raise ProtocolError("unknown_event", f"Unknown event type: {kind}")
        handler(raw)

    def _on_update(self, raw: dict[str, Any]) -> None:
        model = raw.get("model")
        if not model:
            self.error("invalid_event", "Missing required field: model")
        elif model not in self.served_models:
            self.error("model_not_found", f"The model `{model}` does not exist.")
        else:
            self.validated = True

    def _on_append(self, raw: dict[str, Any]) -> None:
        audio = raw.get("audio")
        if not isinstance(audio, str):
            self.error("processing_error", "input_audio_buffer.append requires a string field 'audio'")
            return
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            data = b""
        if not data or len(data) % 2:
            self.error("invalid_audio", "Invalid audio data")
            return
        samples = pcm16_to_float(data)
        if self._stream is not None:
            self._stream.append(samples)
        elif (sum(q.size for q in self._queued) + samples.size) * 4 > MAX_QUEUED_INPUT_BYTES:
            self.error("input_backpressure", "queued input exceeds 16 MiB; commit it first")
        else:
            self._queued.append(samples)

    def _on_commit(self, raw: dict[str, Any]) -> None:
        if not self.validated:
            self.error("model_not_validated", "Send session.update with a model first")
            return
        if raw.get("final") is True:
            if self._stream is not None:
                stream, self._stream = self._stream, None
                self.task = asyncio.create_task(self._generate(stream), name="legacy-generation")
            return
        if self._stream is None and (self.task is None or self.task.done()):
            self._stream = self.engine.create_audio_stream()
            for samples in self._queued:
                self._stream.append(samples)
            self._queued = []

    async def _generate(self, stream: AudioInputStream) -> None:
        has_audio = False
        try:
            request = OmniRequest([Message("user", audio_stream=stream)], speaker=self.default_speaker)
            async for output in self.engine.generate(request):
                if isinstance(output, TextDelta):
                    self._emit({"type": "transcription.delta", "delta": output.text})
                elif isinstance(output, AudioChunk):
                    has_audio = True
                    self._emit({"type": "response.output_audio.delta", "audio": b64(output.pcm16),
                                "format": "pcm16", "sample_rate_hz": output.sample_rate})
                elif isinstance(output, RequestFinished):
                    if output.finish_reason == FinishReason.ERROR:
                        raise RuntimeError(output.error)
                    prompt, completion = output.usage.prompt_tokens, output.usage.text_tokens
                    self._emit({"type": "transcription.done", "text": output.text, "usage": {
                        "prompt_tokens": prompt, "completion_tokens": completion,
                        "total_tokens": prompt + completion, "prompt_tokens_details": None,
                        "completion_tokens_details": None}})
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("legacy generation failed: %s", exc)
            self.error("processing_error", f"generation failed: {type(exc).__name__}")
        finally:
            self._queued = []  # input that arrived during the generation belongs to no turn
        self._emit({"type": "response.output_audio.done", "has_audio": has_audio})

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
