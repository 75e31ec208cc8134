"""Microphone-like input: PCM16 cut into appends, optionally with camera frames bound to the
native-duplex model units (docs/realtime-api.md §13.7)."""

from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_omni.client.events import input_audio_append
from vllm_omni.client.wav import INPUT_RATE

BYTES_PER_MS = INPUT_RATE * 2 // 1000
MAX_FRAMES_PER_APPEND = 2
QUIET = 328  # about -40 dBFS: quieter samples are a recording's lead-in, not speech


@dataclass(frozen=True)
class UnitGrid:
    """Where a natively duplex model's units close on the input timeline (docs/realtime-api.md
    §13.7): unit k at `first_ms + period_ms * k` ms of appended audio. The default is
    MiniCPM-o's (1030, then every 1000 ms); a session announces its model's in
    `capabilities.first_chunk_ms` and `chunk_period_ms`."""

    first_ms: int = 1030
    period_ms: int = 1000

    @classmethod
    def of(cls, capabilities: Mapping[str, Any]) -> UnitGrid:
        period = capabilities.get("chunk_period_ms", cls.period_ms)
        return cls(capabilities.get("first_chunk_ms", period), period)

    def boundary_ms(self, unit: int) -> int:
        return self.first_ms + self.period_ms * unit

    def units(self, clip_ms: int) -> int:
        """Units a clip closes, its residual (zero-padded by the final commit) included."""
        if clip_ms < self.first_ms:
            return 1
        rest = clip_ms - self.first_ms
        return rest // self.period_ms + 1 + (rest % self.period_ms > 0)


MINICPMO_GRID = UnitGrid()


def unit_boundary_ms(unit: int) -> int:
    """Where MiniCPM-o's unit `unit` closes."""
    return MINICPMO_GRID.boundary_ms(unit)


def append_events(pcm: bytes, chunk_ms: int = 200, frames: Sequence[Sequence[str]] | None = None,
                  grid: UnitGrid = MINICPMO_GRID) -> list[dict[str, Any]]:
    """`input_audio_buffer.append` events of `chunk_ms` each, each declaring its 16 kHz rate
    (a GA session's own default is 24 kHz). `frames[k]` (at most two bare base64 images)
    rides the append that closes unit k on `grid`. Frames beyond the audio's units are not sent."""
    if len(pcm) % 2:
        raise ValueError("PCM16 input has an odd number of bytes")
    size = chunk_ms * BYTES_PER_MS
    events, unit = [], 0
    for start in range(0, len(pcm), size):
        chunk = pcm[start:start + size]
        end_ms = (start + len(chunk)) // BYTES_PER_MS
        group = None
        if frames is not None and unit < len(frames) and end_ms >= grid.boundary_ms(unit):
            group = frames[unit]
            if len(group) > MAX_FRAMES_PER_APPEND:
                raise ValueError(f"frames for unit {unit}: {len(group)} given, at most {MAX_FRAMES_PER_APPEND}")
            unit += 1
        events.append(input_audio_append(chunk, video_frames=group, sample_rate_hz=INPUT_RATE))
    return events


def chunk_duration_s(event: dict[str, Any]) -> float:
    """Seconds of audio an append event carries."""
    return len(base64.b64decode(event["audio"])) / BYTES_PER_MS / 1000


def without_lead_in(pcm: bytes, quiet: int = QUIET) -> bytes:
    """PCM16 from its first sample louder than `quiet` on (empty if there is none)."""
    samples = array("h", pcm[:len(pcm) - len(pcm) % 2])
    if sys.byteorder == "big":
        samples.byteswap()
    first = next((index for index, sample in enumerate(samples) if abs(sample) > quiet), len(samples))
    return pcm[2 * first:]
