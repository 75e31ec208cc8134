"""Concurrent server-VAD sessions against a running server: per-turn latency percentiles.

    make serve                                   # in another terminal
    .venv/bin/python benchmarks/realtime_load.py --sessions 8 --turns 3

Each session sends a spoken question (100 ms appends, no pacing) followed by 1.5 s of
silence per turn and waits for the answer. Per turn: TTFP (server's end-of-speech
decision, `speech_stopped`, to the first audio delta), TTFT (same origin, first
transcript text), and RTF (origin to last audio delta, over the audio duration).
Writes JSON and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
import wave
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vllm_omni.client.connection import RealtimeConnection, append_events  # noqa: E402


def percentile(values: list[float], p: float) -> float | None:
    """Nearest rank: the ceil(p n)-th smallest value."""
    values = sorted(v for v in values if math.isfinite(v) and v >= 0)
    if not values:
        return None
    return values[max(0, math.ceil(p * len(values)) - 1)]


def read_pcm16(path: str) -> bytes:
    with wave.open(path) as wav:
        if (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) != (16000, 1, 2):
            raise SystemExit(f"{path}: need 16 kHz mono 16-bit PCM")
        return wav.readframes(wav.getnframes())


async def session(url: str, model: str, pcm: bytes, turns: int) -> list[dict]:
    conn = await RealtimeConnection.open(url)
    results = []
    try:
        await conn.next()
        await conn.send({"type": "session.update", "session": {"model": model, "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": {"type": "server_vad"}}}}})
        await conn.until("session.updated")
        for _ in range(turns):
            await conn.send_all(append_events(pcm + b"\0\0" * 24000))
            events = await conn.until("response.done", timeout=600)
            origin = next(e["_t"] for e in events if e["type"] == "input_audio_buffer.speech_stopped")
            audio = [e for e in events if e["type"] == "response.output_audio.delta"]
            text = [e for e in events if e["type"] == "response.output_audio_transcript.delta" and e["delta"]]
            duration_s = audio[-1]["metadata"]["audio_duration_ms"] / 1000 if audio else 0.0
            results.append({
                "status": events[-1]["response"]["status"], "errors": sum(e["type"] == "error" for e in events),
                "ttfp_ms": (audio[0]["_t"] - origin) * 1000 if audio else None,
                "ttft_ms": (text[0]["_t"] - origin) * 1000 if text else None,
                "rtf": (audio[-1]["_t"] - origin) / duration_s if duration_s else None,
                "audio_s": duration_s})
    finally:
        await conn.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime")
    parser.add_argument("--model", default="qwen3-omni-tiny")
    parser.add_argument("--wav", default=str(REPO.parent / "shared/fixtures/speech_en_single.wav"))
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/realtime_load.json"))
    args = parser.parse_args()
    pcm = read_pcm16(args.wav)

    async def run() -> list[list[dict]]:
        return await asyncio.gather(*(session(args.url, args.model, pcm, args.turns) for _ in range(args.sessions)))

    started = time.monotonic()
    turns = [turn for per_session in asyncio.run(run()) for turn in per_session]
    wall = time.monotonic() - started
    summary = {"sessions": args.sessions, "turns_per_session": args.turns, "wall_s": wall,
               "turns_completed": sum(t["status"] == "completed" for t in turns),
               "error_events": sum(t["errors"] for t in turns),
               "audio_s_per_wall_s": sum(t["audio_s"] for t in turns) / wall}
    for key in ("ttfp_ms", "ttft_ms", "rtf"):
        values = [t[key] for t in turns if t[key] is not None]
        summary[key] = {"p50": percentile(values, 0.5), "p95": percentile(values, 0.95), "max": max(values)}
    print(f"\n{args.sessions} sessions x {args.turns} turns in {wall:.1f} s: "
          f"{summary['turns_completed']}/{len(turns)} completed, {summary['error_events']} error events, "
          f"{summary['audio_s_per_wall_s']:.2f} s of audio per wall second\n")
    print(f"{'':10s} {'p50':>10s} {'p95':>10s} {'max':>10s}")
    for key in ("ttfp_ms", "ttft_ms", "rtf"):
        row = summary[key]
        print(f"{key:10s} {row['p50']:10.3f} {row['p95']:10.3f} {row['max']:10.3f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "turns": turns}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
