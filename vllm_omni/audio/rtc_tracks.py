"""The audio tracks of a WebRTC call (docs/realtime-api.md §15), for the server and for the
clients that call it: the model's speech leaves the server on an outgoing track paced at real
time, and a client's microphone is the same kind of track; what arrives on a track is read
frame by frame. aiortc encodes and decodes the Opus; this module deals in 48 kHz PCM.

The speaker track plays the responses' audio in order and silence between them, 20 ms per
frame at the frame's wall-clock time, so what it has returned is what the caller was sent:
it counts each item's played milliseconds (what a barge-in truncates to) and reports when a
response's audio starts and when its last sample has gone out.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

TRACK_RATE = 48000  # Opus's clock
FRAME_SAMPLES = TRACK_RATE // 50  # 20 ms
TIME_BASE = fractions.Fraction(1, TRACK_RATE)


@dataclass
class _Segment:
    response_id: str
    item_id: str
    samples: np.ndarray  # int16 at TRACK_RATE, what is left to play


class SpeakerTrack(MediaStreamTrack):
    """The call's outgoing audio track. `on_started(response_id)` when a response's first
    sample goes out, `on_stopped(response_id)` after its last one, once it is `finish`ed."""

    kind = "audio"

    def __init__(self, on_started: Callable[[str], None], on_stopped: Callable[[str], None]):
        super().__init__()
        self._on_started, self._on_stopped = on_started, on_stopped
        self._queue: deque[_Segment] = deque()
        self._playing: str | None = None  # the response whose audio is going out
        self.current_item: str | None = None  # the item whose audio went out last
        self._finished: set[str] = set()  # responses that will get no more audio
        self.played_ms: dict[str, float] = {}  # per item
        self._start: float | None = None
        self._timestamp = 0

    def push(self, response_id: str, item_id: str, samples: np.ndarray) -> None:
        """Queue int16 samples at TRACK_RATE of an item of a response."""
        if samples.size:
            self._queue.append(_Segment(response_id, item_id, samples))

    def finish(self, response_id: str) -> None:
        """The response is done: once its queued audio has played, it has stopped."""
        if self._playing == response_id or any(s.response_id == response_id for s in self._queue):
            self._finished.add(response_id)
        if self._playing == response_id and not self._queue:
            self._stop()

    def clear(self) -> str | None:
        """Drop what has not played; the response that was playing or due next (None if none)."""
        playing = self._playing or (self._queue[0].response_id if self._queue else None)
        self._queue.clear()
        self._playing = None
        return playing

    @property
    def playing(self) -> str | None:
        return self._playing

    def _stop(self) -> None:
        stopped, self._playing = self._playing, None
        if stopped is not None:
            self._finished.discard(stopped)
            self._on_stopped(stopped)

    def _take_frame(self) -> np.ndarray:
        frame = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        filled = 0
        while filled < FRAME_SAMPLES and self._queue:
            segment = self._queue[0]
            if segment.response_id != self._playing:
                if self._playing is not None:
                    self._stop()
                self._playing = segment.response_id
                self._on_started(segment.response_id)
            self.current_item = segment.item_id
            count = min(FRAME_SAMPLES - filled, segment.samples.size)
            frame[filled:filled + count] = segment.samples[:count]
            segment.samples = segment.samples[count:]
            filled += count
            self.played_ms[segment.item_id] = self.played_ms.get(segment.item_id, 0.0) + count * 1000 / TRACK_RATE
            if not segment.samples.size:
                self._queue.popleft()
        if not self._queue and self._playing in self._finished:
            self._stop()
        return frame

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._timestamp += FRAME_SAMPLES
            wait = self._start + self._timestamp / TRACK_RATE - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        frame = av.AudioFrame.from_ndarray(self._take_frame().reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = TRACK_RATE, self._timestamp, TIME_BASE
        return frame


def mono_samples(frame: av.AudioFrame) -> np.ndarray:
    """A decoded frame as float32 mono samples at its own rate (channels averaged)."""
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if frame.format.is_planar:
        samples = data.reshape(channels, -1).mean(axis=0)
    else:
        samples = data.reshape(-1, channels).mean(axis=1)
    scale = 32768.0 if frame.format.name.startswith("s16") else 1.0
    return (samples / scale).astype(np.float32)


async def pump_microphone(track: MediaStreamTrack, on_audio: Callable[[np.ndarray, int], Awaitable[None]]) -> None:
    """Hand each frame of the caller's track (float32 mono, rate) to `on_audio` until it ends."""
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        await on_audio(mono_samples(frame), frame.sample_rate)
