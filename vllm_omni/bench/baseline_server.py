"""The baseline: what a team would write without a serving stack. A WebSocket endpoint that
buffers the user's audio, calls transformers' `generate(return_audio=True)` on commit, and
sends the whole answer (transcript, then the audio in 0.5 s deltas) when it is done.

It speaks just enough of the realtime protocol for the benchmark's client (session.update,
input_audio_buffer.append/commit, response.create, playback.ack, session.close). Requests
run one at a time (one model, one lock), as a plain `generate` loop does.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from fastapi import FastAPI, WebSocket, WebSocketDisconnect

OUTPUT_RATE = 24000
DELTA_SAMPLES = OUTPUT_RATE // 2


@dataclass
class BaselineSettings:
    thinker_max_new_tokens: int = 64
    talker_max_new_tokens: int = 256
    speaker: str = "Ethan"


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

    def answer(self, pcm16: bytes) -> tuple[str, bytes]:
        audio = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0
        inputs = self.processor(text=self.prompt, audio=[audio], return_tensors="pt")
        with self.lock, torch.no_grad():
            sequences, waveform = self.model.generate(
                **inputs, return_audio=True, speaker=self.settings.speaker, thinker_do_sample=False,
                talker_do_sample=False, thinker_max_new_tokens=self.settings.thinker_max_new_tokens,
                talker_max_new_tokens=self.settings.talker_max_new_tokens)
        text = self.processor.batch_decode(sequences[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)[0]
        samples = np.clip(waveform.reshape(-1).float().numpy(), -1.0, 1.0)
        return text, (samples * 32767).astype("<i2").tobytes()


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

    return app


async def respond(ws: WebSocket, speaker: TransformersSpeaker, question: bytes) -> None:
    response_id = f"resp_{uuid.uuid4().hex}"
    await ws.send_json({"type": "response.created", "response": {"id": response_id, "status": "in_progress"}})
    text, pcm = await asyncio.to_thread(speaker.answer, question)
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
    """Serve the baseline on a free local port in a background thread; yield its ws URL."""
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
        yield f"ws://127.0.0.1:{port}/v1/realtime"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
