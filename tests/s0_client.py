"""An S0-style duplex client, written from the wire contract alone (the seed's MiniCPM-o demo client:
docs/realtime-api.md §13 and §12). It talks to /v1/realtime through `websockets` directly, not through
vllm_omni.client, so that it reads every field exactly where that client reads it: top-level
`sample_rate_hz`, `metadata.audio_duration_ms`, stage metrics under `vllm_omni` or `metadata`."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import numpy as np
import websockets

FIRST_UNIT_MS = 1030  # unit 0 of a native model; later units every capabilities.chunk_period_ms
DEFAULT_CHUNK_PERIOD_MS = 1000
DEFAULT_OUTPUT_RATE = 24000
APPEND_MS = 200
INPUT_RATE = 16000
SESSION_CREATED_WAIT_S = 20.0
TEXT_DELTAS = ("response.output_audio_transcript.delta", "response.output_text.delta", "response.text.delta")
STAGE_METRIC_PATHS = (("vllm_omni",), ("metadata",), ("metadata", "vllm_omni"), ("response", "metadata"),
                      ("response", "metadata", "vllm_omni"))


def realtime_url(base: str, model: str, session_id: str) -> str:
    """`http(s)://host[:port]` → the duplex URL S0 opens (autostart off: its first message opens)."""
    parts = urlsplit(base)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    query = urlencode({"duplex": 1, "model": model, "native_duplex": 1, "autostart": 0, "session_id": session_id})
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + "/v1/realtime", query, ""))


@dataclass(frozen=True)
class S0Options:
    model: str
    auto_response: bool  # true: the model owns the turns (native); false: commit-driven
    modalities: tuple[str, ...] = ("audio", "text")
    turn_detection: dict[str, Any] | None = None
    ref_audio: str | None = None  # a data URL, for models that speak in a given voice
    instructions: str = "You are a helpful voice assistant."
    temperature: float = 0.0
    idle_timeout_s: int = 120


def session_update(options: S0Options, session_id: str) -> dict[str, Any]:
    """The flat `session.update` (docs/realtime-api.md §2.1 flat shape, §2.5 for the overlap policy)."""
    detection = options.turn_detection
    barge_in = isinstance(detection, dict) and detection.get("interrupt_response", True) is not False
    session: dict[str, Any] = {
        "model": options.model, "modalities": list(options.modalities), "input_audio_format": "pcm16",
        "output_audio_format": "pcm16", "turn_detection": detection,
        "overlap_policy": "barge_in_on_speech" if barge_in else "listen_only",
        "playback_commit_policy": "ack_only",
        "extra_body": {"auto_response": options.auto_response, "native_duplex": True, "force_listen_count": 0},
        "temperature": options.temperature, "instructions": options.instructions, "session_id": session_id,
        "idle_timeout_s": options.idle_timeout_s}
    if options.ref_audio is not None:
        session["ref_audio"] = options.ref_audio
    return {"type": "session.update", "session": session}


def response_id_of(event: dict[str, Any]) -> str | None:
    response = event.get("response")
    return event.get("response_id") or (response.get("id") if isinstance(response, dict) else None)


def stage_metrics_of(event: dict[str, Any]) -> dict[str, Any] | None:
    """Stage metrics where S0 looks for them, in its order (docs/realtime-api.md §5.8)."""
    for path in STAGE_METRIC_PATHS:
        node: Any = event
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        metrics = node.get("stage_metrics") if isinstance(node, dict) else None
        if isinstance(metrics, dict) and metrics:  # an empty object carries no metrics
            return metrics
    return None


@dataclass
class ResponseRecord:
    """What the collector saw of one response, with client receive times (monotonic seconds)."""

    response_id: str
    created_at: float | None = None
    done_at: float | None = None
    status: str | None = None
    t0: float | None = None  # the commit this response answers, when one was sent before it
    first_text_at: float | None = None
    audio_times: list[float] = field(default_factory=list)
    audio_bytes: int = 0
    sample_rates: list[int | None] = field(default_factory=list)  # top-level, per delta; None: absent
    formats: list[str | None] = field(default_factory=list)
    durations_ms: list[int | None] = field(default_factory=list)  # cumulative metadata.audio_duration_ms
    stage_metrics: dict[str, Any] | None = None

    @property
    def sample_rate(self) -> int:
        reported = [rate for rate in self.sample_rates if rate]
        return reported[-1] if reported else DEFAULT_OUTPUT_RATE

    @property
    def played_ms(self) -> int:
        """What S0 acknowledges: all of the response's audio, at its rate."""
        return int(self.audio_bytes * 1000 / (self.sample_rate * 2))


class EventCollector:
    """Every server event with its receive time, and per-response records (S0's collector)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.responses: dict[str, ResponseRecord] = {}
        self.commit_times: list[float] = []  # commits not yet answered by a response
        self.chunk_period_ms = DEFAULT_CHUNK_PERIOD_MS

    def record(self, event: dict[str, Any], at: float) -> None:
        self.events.append(event)
        kind = event.get("type", "")
        if kind.startswith("session.") and isinstance(event.get("session"), dict):
            period = (event["session"].get("capabilities") or {}).get("chunk_period_ms")
            self.chunk_period_ms = period if isinstance(period, int) and period > 0 else self.chunk_period_ms
        rid = response_id_of(event) if kind.startswith("response.") else None
        if rid is None or kind == "response.listen" and rid not in self.responses:
            return
        record = self.responses.setdefault(rid, ResponseRecord(rid))
        if kind == "response.created":
            record.created_at = at
            record.t0, self.commit_times = (self.commit_times[-1], []) if self.commit_times else (None, [])
        elif kind == "response.output_audio.delta":
            self._audio(record, event, at)
        elif kind in TEXT_DELTAS and event.get("delta"):
            record.first_text_at = record.first_text_at or at
        elif kind == "response.done":
            record.done_at, record.status = at, event["response"].get("status")
        metrics = stage_metrics_of(event)
        if metrics is not None:
            record.stage_metrics = metrics

    @staticmethod
    def _audio(record: ResponseRecord, event: dict[str, Any], at: float) -> None:
        payload = event.get("delta") or event.get("audio")
        if not payload:
            return
        record.audio_times.append(at)
        record.audio_bytes += len(base64.b64decode(payload))
        rate = event.get("sample_rate_hz")
        record.sample_rates.append(rate if isinstance(rate, int) else None)
        record.formats.append(event.get("format"))
        duration = (event.get("metadata") or {}).get("audio_duration_ms")
        record.durations_ms.append(duration if isinstance(duration, int | float) else None)

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event.get("type") == kind]


def interval_summary(values: Iterable[float]) -> dict[str, float | int]:
    """count / mean / p50 / p95 (nearest rank) / max, rounded to 0.001 ms, negatives and non-finite dropped."""
    kept = np.array([v for v in values if v is not None and math.isfinite(v) and v >= 0], dtype=float)
    if kept.size == 0:
        return {"count": 0}
    return {"count": int(kept.size), "mean": round(float(kept.mean()), 3),
            "p50": round(float(np.percentile(kept, 50, method="inverted_cdf")), 3),
            "p95": round(float(np.percentile(kept, 95, method="inverted_cdf")), 3),
            "max": round(float(kept.max()), 3)}


def chunk_durations(cumulative: list[int | None]) -> list[float]:
    """Per-chunk durations from cumulative values (a decrease restarts from the new value)."""
    out, previous = [], 0.0
    for value in cumulative:
        if value is None:
            continue
        out.append(value - previous if value >= previous else value)
        previous = value
    return out


def response_timing(record: ResponseRecord) -> dict[str, Any]:
    """One response's timing as S0 reports it (docs/realtime-api.md §12); None where a field is missing."""
    t0 = record.t0 if record.t0 is not None else record.created_at

    def ms(at: float | None) -> float | None:
        return None if at is None or t0 is None else round((at - t0) * 1000, 3)
    reported = [d for d in record.durations_ms if d is not None]
    missing_field = any(d is None for d in record.durations_ms) or any(r is None for r in record.sample_rates)
    duration_ms = None if missing_field or not reported else float(max(reported))
    first_audio = record.audio_times[0] if record.audio_times else None
    generation_ms = ms(record.audio_times[-1]) if record.audio_times else None
    stage0 = (record.stage_metrics or {}).get("0") or {}
    gaps = [1000 * (b - a) for a, b in zip(record.audio_times, record.audio_times[1:], strict=False)]
    return {
        "response_id": record.response_id, "status": record.status,
        "t0_source": "commit" if record.t0 is not None else "response.created",
        "ttft_ms": ms(record.first_text_at), "ttfp_ms": ms(first_audio),
        "audio_duration_ms": duration_ms,
        "sample_rate_hz": None if any(r is None for r in record.sample_rates) else record.sample_rate,
        "format": None if None in record.formats else record.formats[-1],
        "audio_generation_ms": generation_ms,
        "rtf": None if not duration_ms or generation_ms is None else round(generation_ms / duration_ms, 6),
        "chunk_count": len(record.audio_times),
        "response_created_to_first_audio_ms": None if record.created_at is None or first_audio is None
        else round((first_audio - record.created_at) * 1000, 3),
        "commit_to_first_audio_ms": ms(first_audio) if record.t0 is not None else None,
        "inter_chunk_interval_ms": interval_summary(gaps), "max_chunk_gap_ms": round(max(gaps), 3) if gaps else 0.0,
        "chunk_duration_ms": interval_summary(chunk_durations(record.durations_ms)),
        "stage0_output_token_count": stage0.get("num_tokens_out"), "stage0_ttft_ms": stage0.get("vllm_ttft_ms"),
        "stage0_tpot_ms": stage0.get("vllm_tpot_ms"),
        "stage0_itls_ms": None if stage0.get("vllm_itls_ms") is None else interval_summary(stage0["vllm_itls_ms"]),
    }


def timing_summary(collector: EventCollector) -> dict[str, Any]:
    """Per-response timing of the responses that produced audio, and S0's session means."""
    turns = [response_timing(r) for r in collector.responses.values() if r.audio_times]

    def mean(key: str, digits: int) -> float | None:
        values = [t[key] for t in turns if t[key] is not None]
        return round(float(np.mean(values)), digits) if values and len(values) == len(turns) else None
    return {"responses": turns, "audio_turn_count": len(turns), "mean_ttft_ms": mean("ttft_ms", 3),
            "mean_ttfp_ms": mean("ttfp_ms", 3), "mean_rtf": mean("rtf", 6)}


def missing_fields(summary: dict[str, Any]) -> list[str]:
    """Every None in the summary (a commit_to_first_audio_ms only where a commit started the response)."""
    missing = [key for key, value in summary.items() if value is None]
    for turn in summary["responses"]:
        for key, value in turn.items():
            optional = key == "commit_to_first_audio_ms" and turn["t0_source"] != "commit"
            if value is None and not optional:
                missing.append(f"{turn['response_id']}.{key}")
    return missing


class S0Client:
    """One duplex session driven as S0 drives it; `collector` holds everything the server sent."""

    def __init__(self, ws: websockets.ClientConnection, session_id: str):
        self.ws, self.session_id = ws, session_id
        self.collector = EventCollector()
        self._changed = asyncio.Condition()
        self.closed = False  # the socket is gone: nothing more will arrive
        self._reader = asyncio.create_task(self._read())
        self.sent: list[dict[str, Any]] = []

    @classmethod
    async def connect(cls, base: str, model: str) -> S0Client:
        session_id = f"s0-{uuid.uuid4().hex[:12]}"
        return cls(await websockets.connect(realtime_url(base, model, session_id), max_size=None), session_id)

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                self.collector.record(json.loads(message), time.monotonic())
                async with self._changed:
                    self._changed.notify_all()
        finally:
            self.closed = True
            async with self._changed:
                self._changed.notify_all()

    async def send(self, event: dict[str, Any]) -> float:
        await self.ws.send(json.dumps(event))
        self.sent.append(event)
        return time.monotonic()

    async def wait_for(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        async def waiting() -> None:
            async with self._changed:
                while not ready():
                    if self.closed:
                        raise AssertionError(f"the socket closed while waiting for {what}")
                    await self._changed.wait()
        try:
            await asyncio.wait_for(waiting(), timeout)
        except TimeoutError:
            raise AssertionError(f"no {what} within {timeout:.0f} s; last events: "
                                 f"{[e.get('type') for e in self.collector.events[-8:]]}") from None

    def count(self, kind: str) -> int:
        return len(self.collector.of_type(kind))

    async def configure(self, options: S0Options) -> None:
        await self.send(session_update(options, self.session_id))
        await self.wait_for(lambda: self.count("session.created") > 0, SESSION_CREATED_WAIT_S, "session.created")

    async def stream_pcm16(self, pcm: bytes, frames: list[str] | None = None, realtime: bool = True) -> None:
        """200 ms appends, paced in real time; frame k (the last one repeating) rides the append
        whose cumulative end first reaches unit k's boundary (docs/realtime-api.md §13.7, §13.8)."""
        step = 2 * INPUT_RATE * APPEND_MS // 1000
        start, end_ms, unit = time.monotonic(), 0, 0
        for index, offset in enumerate(range(0, len(pcm), step)):
            chunk = pcm[offset: offset + step]
            duration_ms = len(chunk) * 1000 // (2 * INPUT_RATE)
            end_ms += duration_ms
            event: dict[str, Any] = {"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode(),
                                     "input_audio_format": "pcm16", "sample_rate_hz": INPUT_RATE,
                                     "duration_ms": duration_ms, "audio_end_ms": end_ms}
            if frames and end_ms >= FIRST_UNIT_MS + self.collector.chunk_period_ms * unit:
                event["video_frames"] = [frames[min(unit, len(frames) - 1)]]
                unit += 1
            if realtime:
                await asyncio.sleep(max(0.0, start + index * APPEND_MS / 1000 - time.monotonic()))
            await self.send(event)

    async def commit(self) -> None:
        self.collector.commit_times.append(await self.send({"type": "input_audio_buffer.commit", "final": True}))

    async def settle(self, responses: int, timeout: float) -> None:
        """Until the final commit is committed, at least `responses` responses ended, and none is
        left without its response.done."""
        def idle() -> bool:
            records = [r for r in self.collector.responses.values() if r.created_at]
            return self.count("input_audio_buffer.committed") > 0 and len(records) >= responses and all(
                r.done_at for r in records)
        await self.wait_for(idle, timeout, "the end of every response")

    async def acknowledge_playback(self, timeout: float) -> list[ResponseRecord]:
        """`playback.ack` for every response that produced audio, as if all of it was played."""
        played = [r for r in self.collector.responses.values() if r.audio_bytes]
        before = self.count("playback.acknowledged")
        for record in played:
            heard = record.played_ms
            await self.send({"type": "playback.ack", "response_id": record.response_id,
                             "item_id": f"item_{record.response_id}", "played_ms": heard, "committed_ms": heard})
        await self.wait_for(lambda: self.count("playback.acknowledged") >= before + len(played), timeout,
                            "playback.acknowledged")
        return played

    async def close_session(self, timeout: float) -> None:
        await self.send({"type": "session.close"})
        await self.wait_for(lambda: self.count("session.closed") > 0, timeout, "session.closed")
        await asyncio.wait_for(self.ws.wait_closed(), timeout)
        await self._reader

    async def abort(self) -> None:
        await self.ws.close()
        self._reader.cancel()
