"""Input transcription (GA `audio.input.transcription`, docs/realtime-api.md §5.2): the served
model itself transcribes each committed user turn, in a text-only request on the same audio
features. It starts once the turn's answer has sent its first audio (or ended), so it never
delays first audio; its deltas, then one `.completed` (or `.failed`), carry the item's id, and
the transcript is stored in the item."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from vllm_omni.engine.interface import EngineClient
from vllm_omni.engine.request import Message, OmniRequest, RequestError, RequestFinished, TextDelta
from vllm_omni.protocol.server_event_builders import (
    input_transcription_completed,
    input_transcription_delta,
    input_transcription_failed,
)
from vllm_omni.session.base import Emit
from vllm_omni.session.conversation import Item

logger = logging.getLogger(__name__)

INSTRUCTIONS = "Transcribe the user's speech exactly as spoken. Reply with the transcript only."
MAX_TRANSCRIPT_TOKENS = 256
ANSWER_AUDIO_WAIT_S = 30.0  # the longest a transcription waits for the answer's first audio


def transcription_instructions(settings: dict[str, Any]) -> str:
    """INSTRUCTIONS, with the client's `language` and `prompt` (GA transcription settings)."""
    parts = [INSTRUCTIONS]
    if isinstance(settings.get("language"), str) and settings["language"]:
        parts.append(f"The speech is in the language with code {settings['language']}.")
    if isinstance(settings.get("prompt"), str) and settings["prompt"]:
        parts.append(settings["prompt"])
    return " ".join(parts)


class Transcriber:
    def __init__(self, engine: EngineClient, emit: Emit, session_id: str,
                 answer_audio: Callable[[], asyncio.Event | None]):
        """`answer_audio`: the active answer's first-audio event, or None without an answer."""
        self.engine, self._emit, self.session_id = engine, emit, session_id
        self._answer_audio = answer_audio
        self._tasks: set[asyncio.Task] = set()

    def start(self, item: Item, audio_seconds: float, settings: dict[str, Any]) -> None:
        task = asyncio.create_task(self._run(item, audio_seconds, settings), name=f"transcribe-{item.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, item: Item, audio_seconds: float, settings: dict[str, Any]) -> None:
        await asyncio.sleep(0)  # the answer to this turn starts in the same event, after the commit
        started = self._answer_audio()
        if started is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(started.wait(), ANSWER_AUDIO_WAIT_S)
        request = OmniRequest([Message("system", text=transcription_instructions(settings)),
                               Message("user", audio_stream=item.stream)], modalities=("text",),
                              request_id=f"{self.session_id}-transcribe-{item.id}",
                              max_output_tokens=MAX_TRANSCRIPT_TOKENS, temperature=0.0)
        transcript = ""
        try:
            async for output in self.engine.generate(request):
                if isinstance(output, TextDelta):
                    transcript += output.text
                    self._emit(input_transcription_delta(item_id=item.id, delta=output.text))
                elif isinstance(output, RequestFinished) and output.error is not None:
                    raise RequestError(output.error)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed transcription fails only itself
            logger.warning("transcribing %s failed: %s", item.id, exc)
            self._emit(input_transcription_failed(item_id=item.id, code="transcription_failed", message=str(exc)))
            return
        item.transcript = transcript.strip()
        self._emit(input_transcription_completed(item_id=item.id, transcript=item.transcript,
                                                 audio_seconds=audio_seconds))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
