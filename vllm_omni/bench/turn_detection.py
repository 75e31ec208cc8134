"""`vllm-omni bench turn-detection`: how soon, and how correctly, a server ends the user's
turns under each turn-detection setting, on the same recordings in the same run.

Each (setting, recording) pair gets its own session; the recording plus trailing silence is
streamed at real time with `create_response: false`, so only turn detection is measured. The
reference speech ends come from Silero in this process (a 500 ms pause ends speech; the end
is where that pause began). Per turn the server ends, the delay is the wall time from the
moment the stream passed that speech end to the `input_audio_buffer.committed` event.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from vllm_omni.audio.pcm import MODEL_RATE, pcm16_to_float
from vllm_omni.audio.silero_vad import SileroModel, VadConfig, VadDetector
from vllm_omni.bench.report import pyplot, save_figure, write_json
from vllm_omni.client.connection import RealtimeConnection
from vllm_omni.client.session_setup import ga_session_update
from vllm_omni.client.streaming import append_events
from vllm_omni.client.timing import summarize

REFERENCE_SILENCE_MS = 500
CHUNK_MS = 20


@dataclass(frozen=True)
class Recording:
    name: str
    pcm: bytes  # 16 kHz mono PCM16

    @cached_property
    def speech_ends_s(self) -> list[float]:
        """Where Silero hears each stretch of speech end (seconds); found once per recording,
        however many settings it is measured under."""
        samples = pcm16_to_float(self.pcm)
        padded = np.concatenate([samples, np.zeros(MODEL_RATE, np.float32)])  # so the last pause completes
        detector = VadDetector(SileroModel.load(), VadConfig(silence_duration_ms=REFERENCE_SILENCE_MS))
        ends = []
        for start in range(0, padded.size, 512):
            step = detector.feed(padded[start:start + 512])
            if step.stopped:
                ends.append(step.end_sample / MODEL_RATE - REFERENCE_SILENCE_MS / 1000)
        return ends


def turn_detection(setting: str) -> dict[str, Any]:
    """`server_vad` or `semantic_vad:<eagerness>` as a turn_detection object that only commits."""
    kind, _, eagerness = setting.partition(":")
    if kind == "server_vad" and not eagerness:
        return {"type": "server_vad", "create_response": False}
    if kind == "semantic_vad" and eagerness in ("low", "medium", "high", "auto"):
        return {"type": "semantic_vad", "eagerness": eagerness, "create_response": False}
    raise ValueError(f"unknown setting {setting!r}: expected server_vad or semantic_vad:<low|medium|high|auto>")


async def measure(url: str, setting: str, recording: Recording, trailing_silence_s: float) -> dict[str, Any]:
    """One session: the turns the server ended and each one's delay after the speech end."""
    connection = await RealtimeConnection.open(url)
    try:
        await connection.send(ga_session_update(server_vad=True, vad=turn_detection(setting),
                                                output_modalities=("text",)))
        await connection.until("session.updated", timeout=30)
        silence = b"\0\0" * int(MODEL_RATE * trailing_silence_s)
        started = time.monotonic()
        await connection.stream(append_events(recording.pcm + silence, chunk_ms=CHUNK_MS))
        await asyncio.sleep(0.5)  # a verdict on the last pause may still be on its way
        await _take_received(connection)
    finally:
        await connection.close()
    speech_ends = recording.speech_ends_s
    turns = []
    for event in connection.events:
        if event["type"] == "input_audio_buffer.speech_stopped":
            turns.append({"audio_end_ms": event["audio_end_ms"]})
        elif event["type"] == "input_audio_buffer.committed" and turns:
            end_s = turns[-1]["audio_end_ms"] / 1000
            spoken = [s for s in speech_ends if s <= end_s]
            turns[-1]["delay_ms"] = round((event["_t"] - started - spoken[-1]) * 1000) if spoken else None
    errors = [e["error"]["code"] for e in connection.events if e["type"] == "error"]
    return {"setting": setting, "recording": recording.name, "speech_ends_s": [round(s, 3) for s in speech_ends],
            "turns": turns, "errors": errors,
            "delay_ms": summarize(t.get("delay_ms") for t in turns)}


async def _take_received(connection: RealtimeConnection) -> None:
    """Move every event received so far into `connection.events` (each stamped on arrival)."""
    while True:
        try:
            await connection.next(timeout=0.1)
        except TimeoutError:
            return


def run_benchmark(url: str, settings: list[str], recordings: list[Recording], trailing_silence_s: float,
                  progress: Any = print) -> list[dict[str, Any]]:
    rows = []
    for setting in settings:
        for recording in recordings:
            progress(f"{setting:22s} {recording.name} ...")
            rows.append(asyncio.run(measure(url, setting, recording, trailing_silence_s)))
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'setting':22s} {'recording':28s} {'speech':>6s} {'turns':>5s} {'delay p50':>9s} "
             f"{'delay max':>9s} {'errors':>6s}"]
    for row in rows:
        delay = row["delay_ms"]
        lines.append(f"{row['setting']:22s} {row['recording']:28s} {len(row['speech_ends_s']):6d} "
                     f"{len(row['turns']):5d} {_ms(delay['p50']):>9s} {_ms(delay['max']):>9s} "
                     f"{len(row['errors']):6d}")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def write_results(rows: list[dict[str, Any]], settings: dict[str, Any], out_dir: Path) -> list[Path]:
    json_path = write_json(out_dir, "turn_detection.json", settings, rows)
    return [json_path, write_plot(rows, out_dir / "turn_detection.png")]


def write_plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """Each turn's delay after the speech end, one column per setting."""
    plt = pyplot()
    settings = list(dict.fromkeys(row["setting"] for row in rows))
    figure, axis = plt.subplots(figsize=(8, 4))
    for x, setting in enumerate(settings):
        delays = [t["delay_ms"] for row in rows if row["setting"] == setting for t in row["turns"]
                  if t.get("delay_ms") is not None]
        axis.scatter([x] * len(delays), delays, alpha=0.7)
    axis.set_xticks(range(len(settings)), settings)
    axis.set(title="end of speech → turn committed", ylabel="ms")
    axis.grid(alpha=0.3)
    return save_figure(figure, path)
