"""Client-observed latency of realtime responses (docs/realtime-api.md §12).

All times are the client's monotonic receive times (`_t` on each received event). Values
that are missing, negative or not finite are ignored, never fatal: a metric that cannot be
computed is None.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterable, Sequence
from typing import Any

from vllm_omni.client.playback import playback_metrics
from vllm_omni.protocol.server_event_types import (
    OUTPUT_AUDIO_DELTA,
    OUTPUT_AUDIO_TRANSCRIPT_DELTA,
    OUTPUT_TEXT_DELTA,
    RESPONSE_CREATED,
)

TEXT_DELTAS = (OUTPUT_AUDIO_TRANSCRIPT_DELTA, OUTPUT_TEXT_DELTA, "response.text.delta")  # the last: beta servers


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def summarize(values: Iterable[Any]) -> dict[str, float | int | None]:
    """count, mean, min, p50, p95 (nearest rank: the ceil(p n)-th smallest) and max, rounded
    to 0.001, after dropping negative and non-finite values."""
    kept = sorted(v for v in (_finite(x) for x in values) if v is not None and v >= 0)
    if not kept:
        return {"count": 0, "mean": None, "min": None, "p50": None, "p95": None, "max": None}

    def rank(p: float) -> float:
        return kept[max(0, math.ceil(p * len(kept)) - 1)]

    return {"count": len(kept), "mean": round(sum(kept) / len(kept), 3), "min": round(kept[0], 3),
            "p50": round(rank(0.5), 3), "p95": round(rank(0.95), 3), "max": round(kept[-1], 3)}


def audio_payload(event: dict[str, Any]) -> bytes:
    """An audio delta's decoded bytes (`delta`, or its alias `audio`); empty when absent or invalid."""
    payload = event.get("delta") or event.get("audio")
    try:
        return base64.b64decode(payload, validate=True) if isinstance(payload, str) else b""
    except (binascii.Error, ValueError):
        return b""


def _audio_bytes(event: dict[str, Any]) -> int:
    return len(audio_payload(event))


def pcm16_ms(byte_count: int, rate: float) -> float:
    """The duration of `byte_count` bytes of mono PCM16 at `rate` Hz."""
    return byte_count * 1000 / (rate * 2)


def _extension(event: dict[str, Any]) -> dict[str, Any]:
    """An event's [EXT] report (`vllm_omni`), empty when the server sent none."""
    report = event.get("vllm_omni")
    return report if isinstance(report, dict) else {}


def audio_rate(event: dict[str, Any]) -> float | None:
    """An audio delta's sample rate: `vllm_omni.sample_rate_hz`, or the legacy lane's
    top-level `sample_rate_hz`; None when neither is a positive number."""
    rate = _finite(_extension(event).get("sample_rate_hz")) or _finite(event.get("sample_rate_hz"))
    return rate if rate is not None and rate > 0 else None


def _cumulative_ms(event: dict[str, Any]) -> float | None:
    """An audio delta's cumulative `vllm_omni.audio_duration_ms`; None unless a number ≥ 0."""
    mark = _finite(_extension(event).get("audio_duration_ms"))
    return mark if mark is not None and mark >= 0 else None


def _bytes_ms(event: dict[str, Any]) -> float:
    return pcm16_ms(_audio_bytes(event), audio_rate(event) or 24000.0)


def _audio_duration_ms(audio: Sequence[dict[str, Any]]) -> float:
    """Max of the deltas' cumulative `vllm_omni.audio_duration_ms`; else from the bytes."""
    marks = [m for m in (_cumulative_ms(e) for e in audio) if m is not None]
    return max(marks) if marks else sum(_bytes_ms(event) for event in audio)


def _chunk_durations(audio: Sequence[dict[str, Any]]) -> list[float]:
    """Each delta's duration: the difference of its cumulative duration and the audio before it
    (a decrease restarts from the new value), or, without a cumulative one, from its bytes."""
    durations, previous = [], 0.0
    for event in audio:
        mark = _cumulative_ms(event)
        if mark is None:
            durations.append(_bytes_ms(event))
            previous += durations[-1]
        else:
            durations.append(mark - previous if mark >= previous else mark)
            previous = mark
    return durations


def response_metrics(events: Sequence[dict[str, Any]], t0: float | None) -> dict[str, Any]:
    """Metrics of one response from its received events, with what a listener hears of its
    audio (`playback_metrics`). `t0`: the commit's send time, or None to use the receive time
    of `response.created`."""
    if t0 is None:
        t0 = next((e["_t"] for e in events if e.get("type") == RESPONSE_CREATED and _finite(e.get("_t"))), None)
    audio = [e for e in events if e.get("type") == OUTPUT_AUDIO_DELTA and _audio_bytes(e) and _finite(e.get("_t"))]
    text = [e for e in events if e.get("type") in TEXT_DELTAS and e.get("delta") and _finite(e.get("_t"))]
    times = [e["_t"] for e in audio]
    duration_ms = _audio_duration_ms(audio)

    def since_t0(t: float | None) -> float | None:
        return None if t is None or t0 is None else max(0.0, (t - t0) * 1000)

    generation_ms = since_t0(times[-1] if times else None)
    gaps = [(b - a) * 1000 for a, b in zip(times, times[1:], strict=False)]
    chunk_ms = _chunk_durations(audio)
    ttfp_ms = since_t0(times[0] if times else None)
    return {
        "ttft_ms": since_t0(text[0]["_t"] if text else None),
        "ttfp_ms": ttfp_ms,
        "audio_duration_ms": duration_ms,
        "rtf": generation_ms / duration_ms if generation_ms is not None and duration_ms > 0 else None,
        "chunk_count": len(audio),
        "inter_chunk_interval_ms": summarize(gaps),
        "max_chunk_gap_ms": max(gaps) if gaps else None,
        "chunk_duration_ms": summarize(chunk_ms),
        **playback_metrics([(t * 1000, ms) for t, ms in zip(times, chunk_ms, strict=True)], ttfp_ms),
    }


def session_summary(turns: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Means over the turns that produced audio."""
    with_audio = [t for t in turns if t.get("chunk_count")]

    def mean(key: str, digits: int) -> float | None:
        values = [v for v in (_finite(t.get(key)) for t in with_audio) if v is not None]
        return round(sum(values) / len(values), digits) if values else None

    return {"audio_turn_count": len(with_audio), "mean_ttft_ms": mean("ttft_ms", 3),
            "mean_ttfp_ms": mean("ttfp_ms", 3), "mean_rtf": mean("rtf", 6)}
