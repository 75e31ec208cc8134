"""The baseline: what a team would write without a serving stack. A WebSocket endpoint that
buffers the user's audio, calls transformers' `generate(return_audio=True)` on commit, and
sends the whole answer (transcript, then the audio in 0.5 s deltas) when it is done; and the
same over HTTP, as OpenAI's `POST /v1/chat/completions` with audio output.

It speaks just enough of the realtime protocol for the benchmark's client (session.update,
input_audio_buffer.append/commit, response.create, playback.ack, session.close), and of chat
completions for client/chat.py (the last user message's first WAV `input_audio` part is the
question; the history and the voice are ignored). Requests run one at a time (one model, one
lock), as a plain `generate` loop does.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, Response, StreamingResponse

from vllm_omni.audio.pcm import float_to_pcm16_bytes, pcm16_to_float
from vllm_omni.client.wav import read_pcm16, wav_bytes

OUTPUT_RATE = 24000
DELTA_SAMPLES = OUTPUT_RATE // 2
MODEL_NAME = "transformers-baseline"
AUDIO_TTL_S = 3600


@dataclass
class BaselineSettings:
    thinker_max_new_tokens: int = 64
    talker_max_new_tokens: int = 256
    speaker: str = "Ethan"


class Answer(NamedTuple):
    text: str
    pcm: bytes  # 24 kHz PCM16
    prompt_tokens: int
    completion_tokens: int  # the thinker's


class TransformersSpeaker:
    """transformers' Qwen3-Omni: 16 kHz PCM16 question in, (text, 24 kHz PCM16) out."""

    def __init__(self, model_path: str, settings: BaselineSettings):
        from transformers import AutoProcessor, Qwen3OmniMoeForConditionalGeneration

        self.processor = AutoProcessor.from_pretrained(model_path, local_files_only=True)
        self.model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
            model_path, dtype=torch.float32, local_files_only=True).eval()
        self.settings = settings
        self.lock = threading.Lock()
        self.prompt = self.processor.apply_chat_template([{"role": "user", "content": [{"type": "audio"}]}],
                                                         add_generation_prompt=True, tokenize=False)

    def answer(self, pcm16: bytes) -> Answer:
        audio = pcm16_to_float(pcm16)
        inputs = self.processor(text=self.prompt, audio=[audio], return_tensors="pt")
        with self.lock, torch.no_grad():
            sequences, waveform = self.model.generate(
                **inputs, return_audio=True, speaker=self.settings.speaker, thinker_do_sample=False,
                talker_do_sample=False, thinker_max_new_tokens=self.settings.thinker_max_new_tokens,
                talker_max_new_tokens=self.settings.talker_max_new_tokens)
        prompt_tokens = inputs["input_ids"].shape[1]
        text = self.processor.batch_decode(sequences[:, prompt_tokens:], skip_special_tokens=True)[0]
        samples = np.clip(waveform.reshape(-1).float().numpy(), -1.0, 1.0)
        return Answer(text, float_to_pcm16_bytes(samples), prompt_tokens,
                      sequences.shape[1] - prompt_tokens)


def create_baseline_app(speaker: TransformersSpeaker) -> FastAPI:
    app = FastAPI(title="transformers baseline")

    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket) -> None:
        await ws.accept()
        await ws.send_json({"type": "session.created", "session": {"id": f"sess_{uuid.uuid4().hex}"}})
        buffered, committed = bytearray(), b""
        try:
            while True:
                event: dict[str, Any] = await ws.receive_json()
                kind = event.get("type")
                if kind == "session.update":
                    await ws.send_json({"type": "session.updated", "session": event.get("session", {})})
                elif kind == "input_audio_buffer.append":
                    buffered += base64.b64decode(event.get("audio", ""))
                elif kind == "input_audio_buffer.commit":
                    committed, buffered = bytes(buffered), bytearray()
                    await ws.send_json({"type": "input_audio_buffer.committed"})
                elif kind == "response.create":
                    await respond(ws, speaker, committed)
                elif kind == "session.close":
                    await ws.send_json({"type": "session.closed"})
                    await ws.close()
                    return
        except WebSocketDisconnect:
            return

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "created": 0,
                                            "owned_by": "transformers"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        try:
            body = await request.json()
            question, audio_format = chat_request(body)
        except ValueError as exc:  # a body that is not JSON included
            return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error", "param": None,
                                           "code": None}}, status_code=400)
        reply = ChatReply(body.get("model") or MODEL_NAME, await asyncio.to_thread(speaker.answer, question))
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(reply.sse(usage), media_type="text/event-stream")
        return JSONResponse(reply.completion(audio_format))

    return app


def _wav_pcm16(data: Any) -> bytes:
    """The samples of a base64 16 kHz mono PCM16 WAV."""
    try:
        wav = base64.b64decode(data, validate=True)
    except (binascii.Error, TypeError) as exc:
        raise ValueError(f"input_audio.data: not base64 ({exc})") from None
    return read_pcm16(wav, "input_audio.data")


def chat_request(body: Any) -> tuple[bytes, str]:
    """A chat completion request's question (16 kHz PCM16) and the audio format it wants."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise ValueError("messages: required")
    audio_format = (body.get("audio") or {}).get("format", "pcm16")
    if audio_format not in ("pcm16", "wav"):
        raise ValueError(f"audio.format: the baseline answers in pcm16 or wav, not {audio_format!r}")
    if body.get("stream") and audio_format != "pcm16":
        raise ValueError("audio.format: only pcm16 is supported when stream is true")
    user = next((m for m in reversed(body["messages"]) if isinstance(m, dict) and m.get("role") == "user"), {})
    parts = user.get("content") if isinstance(user.get("content"), list) else []
    audio = next((p.get("input_audio") or {} for p in parts if isinstance(p, dict) and p.get("type") == "input_audio"),
                 None)
    if audio is None or audio.get("format") != "wav":
        raise ValueError("messages: the last user message needs an input_audio part of format wav")
    return _wav_pcm16(audio.get("data")), audio_format


class ChatReply:
    """A whole answer, shaped as an OpenAI chat completion or as its stream of chunks."""

    def __init__(self, model: str, answer: Answer):
        self.model, self.answer = model, answer
        self.id, self.audio_id = f"chatcmpl-{uuid.uuid4().hex}", f"audio_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.expires_at = self.created + AUDIO_TTL_S

    def _usage(self) -> dict[str, int]:
        prompt, completion = self.answer.prompt_tokens, self.answer.completion_tokens
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def completion(self, audio_format: str) -> dict[str, Any]:
        data = wav_bytes(self.answer.pcm, OUTPUT_RATE) if audio_format == "wav" else self.answer.pcm
        audio = {"id": self.audio_id, "data": base64.b64encode(data).decode(), "transcript": self.answer.text,
                 "expires_at": self.expires_at}
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": None, "audio": audio}}],
                "usage": self._usage()}

    def _chunk(self, delta: dict[str, Any] | None, finish_reason: str | None = None) -> str:
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                 "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
        if delta is None:
            chunk["usage"] = self._usage()
        return f"data: {json.dumps(chunk)}\n\n"

    def sse(self, include_usage: bool) -> Iterator[str]:
        """The transcript in one chunk, the audio in 0.5 s pieces, the finish, usage if asked, [DONE]."""
        yield self._chunk({"role": "assistant", "audio": {"id": self.audio_id, "transcript": self.answer.text,
                                                          "expires_at": self.expires_at}})
        pcm = self.answer.pcm
        for start in range(0, len(pcm), 2 * DELTA_SAMPLES):
            piece = base64.b64encode(pcm[start:start + 2 * DELTA_SAMPLES]).decode()
            yield self._chunk({"audio": {"id": self.audio_id, "data": piece}})
        yield self._chunk({}, "stop")
        if include_usage:
            yield self._chunk(None)
        yield "data: [DONE]\n\n"


async def respond(ws: WebSocket, speaker: TransformersSpeaker, question: bytes) -> None:
    response_id = f"resp_{uuid.uuid4().hex}"
    await ws.send_json({"type": "response.created", "response": {"id": response_id, "status": "in_progress"}})
    text, pcm, _, _ = await asyncio.to_thread(speaker.answer, question)
    await ws.send_json({"type": "response.output_audio_transcript.delta", "response_id": response_id,
                        "delta": text})
    for start in range(0, len(pcm), 2 * DELTA_SAMPLES):
        await ws.send_json({"type": "response.output_audio.delta", "response_id": response_id,
                            "delta": base64.b64encode(pcm[start:start + 2 * DELTA_SAMPLES]).decode(),
                            "sample_rate_hz": OUTPUT_RATE})
    await ws.send_json({"type": "response.done", "response": {"id": response_id, "status": "completed"}})


@contextmanager
def running_baseline(model_path: str, settings: BaselineSettings | None = None,
                     start_timeout_s: float = 120.0) -> Iterator[str]:
    """Serve the baseline on a free local port in a background thread; yield its base URL,
    `http://127.0.0.1:PORT` (client/url.py's `realtime_url` and `chat_base_url` take it)."""
    import uvicorn

    app = create_baseline_app(TransformersSpeaker(model_path, settings or BaselineSettings()))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           ws_max_size=16 * 1024 * 1024))
    thread = threading.Thread(target=server.run, name="baseline-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the baseline server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
