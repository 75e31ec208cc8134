"""Where time to first audio goes: realtime sessions against a running server, hop by hop.

For each turn it splits the client-measured TTFP (commit sent → first audio delta received)
into the hops of the serving path, from the client's receive times and the server's own
marks in `response.done` (`vllm_omni.timing` and `stage_metrics`, docs/realtime-api.md §5.8):

    client commit → response.created received   socket in, commit and response handling, socket out
    response created → engine request            prompt rendering in the session
    engine request → first <stage> output        each stage in pipeline order (thinker token,
                                                 talker frame, code2wav audio)
    last stage's first audio → session delta out  engine → session hand-off
    session delta out → client receives it        outbox, socket, client parsing (the rest)

    .venv/bin/python benchmarks/ttfp_breakdown.py --url http://127.0.0.1:8000 \\
        --wav tests/data/speech_en_single.wav [--turns 5] [--sessions 1] [--out ttfp_breakdown.json]

With `--sessions N`, N sessions run at once (where the time goes under load). Writes JSON
(every turn's hops) and prints the median and p95 of each hop over all turns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vllm_omni.client.turns import SessionResult, TurnResult, run_session  # noqa: E402
from vllm_omni.client.url import realtime_url  # noqa: E402
from vllm_omni.client.wav import read_pcm16  # noqa: E402
from vllm_omni.protocol.server_event_types import OUTPUT_AUDIO_DELTA, RESPONSE_CREATED, RESPONSE_DONE  # noqa: E402


def _first_t(events: list[dict[str, Any]], kind: str) -> float:
    return next(e["_t"] for e in events if e.get("type") == kind)


def turn_hops(turn: TurnResult) -> dict[str, float]:
    """The hops of one answered turn, in ms, in path order; they add up to its TTFP."""
    events = turn.response.events
    ttfp = turn.metrics["ttfp_ms"]
    done = next(e for e in events if e.get("type") == RESPONSE_DONE)["vllm_omni"]
    timing = done["timing"]
    commit_t = _first_t(events, OUTPUT_AUDIO_DELTA) - ttfp / 1000
    created_ms = (_first_t(events, RESPONSE_CREATED) - commit_t) * 1000
    stages = sorted(done["stage_metrics"].values(), key=lambda m: m["vllm_ttft_ms"])
    hops = {"commit → response.created (client)": created_ms,
            "response created → engine request": timing["engine_request_ms"]}
    previous = 0.0
    for stage in stages:
        hops[f"→ first {stage['role']} output"] = stage["vllm_ttft_ms"] - previous
        previous = stage["vllm_ttft_ms"]
    hops["→ first audio delta out of the session"] = timing["first_audio_ms"] - timing["engine_request_ms"] - previous
    # what is left: the delta's way to the client minus response.created's (counted in the first hop)
    hops["→ received by the client (transit)"] = ttfp - created_ms - timing["first_audio_ms"]
    return {name: round(ms, 2) for name, ms in hops.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="a running vllm-omni server (http(s)://host:port or ws(s)://…)")
    parser.add_argument("--wav", required=True, help="the spoken question: 16 kHz mono 16-bit PCM WAV")
    parser.add_argument("--turns", type=int, default=5, help="turns in the session (default 5)")
    parser.add_argument("--sessions", type=int, default=1, help="concurrent sessions (default 1)")
    parser.add_argument("--model", help="model name to ask for (default: the server's)")
    parser.add_argument("--out", default="ttfp_breakdown.json", help="where the JSON goes")
    args = parser.parse_args()
    results = asyncio.run(run_sessions(realtime_url(args.url, model=args.model), read_pcm16(args.wav),
                                       args.sessions, args.turns, args.model))
    answered = [t for result in results for t in result.turns
                if t.response is not None and t.metrics["ttfp_ms"] is not None]
    if not answered:
        print("error: no turn produced audio", file=sys.stderr)
        return 1
    turns = [{**turn_hops(t), "TTFP (client)": round(t.metrics["ttfp_ms"], 2)} for t in answered]
    Path(args.out).write_text(json.dumps({"settings": vars(args), "turns": turns}, indent=2))
    print(f"{args.sessions} session(s), {len(turns)} answered turns")
    print(f"{'hop':45s} {'p50 ms':>8s} {'p95 ms':>8s}")
    for name in turns[0]:
        p50, p95 = np.percentile([t[name] for t in turns], [50, 95])
        print(f"{name:45s} {p50:8.1f} {p95:8.1f}")
    print(f"wrote {args.out}")
    return 0


async def run_sessions(url: str, pcm: bytes, sessions: int, turns: int, model: str | None) -> list[SessionResult]:
    return list(await asyncio.gather(*(run_session(url, pcm, turns=turns, model=model) for _ in range(sessions))))


if __name__ == "__main__":
    sys.exit(main())
