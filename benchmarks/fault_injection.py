"""Stage death on the vLLM configuration: SIGKILL one engine process mid-request, six ways.

    .venv/bin/python benchmarks/fault_injection.py [--model DIR] [--out FILE]

The thinker and the talker run on vLLM engines with `restart_on_failure`. For each engine
(thinker, talker) and each point of a request (right after the submit, after the first
audio chunk, while only the talker still runs) one request is started and the engine's
EngineCore process is killed; measured: the time from the kill to the request's final
record (finish_reason "error", error_code "stage_unavailable"), how long a new request
takes to be refused, and how long the stage takes to restart. One engine pair serves all
six kills. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.engine_helpers import make_engine, run_request  # noqa: E402
from tests.fault_helpers import KILL_POINTS, kill_during_request, wait_until_healthy  # noqa: E402
from vllm_omni.engine import Message, OmniEngine, OmniRequest  # noqa: E402
from vllm_omni.models.qwen3_omni.checkpoint import load_checkpoint  # noqa: E402

RESTART_TIMEOUT_S = 600.0


async def kill_six_ways(engine: OmniEngine) -> list[dict]:
    rows = []
    for role in ("thinker", "talker"):
        for point in KILL_POINTS:
            outcome = await kill_during_request(engine, role, point)
            restart_s = await wait_until_healthy(engine, RESTART_TIMEOUT_S)
            check = await run_request(engine, OmniRequest([Message("user", text="Still there?")],
                                                          sampling={"thinker": {"max_tokens": 8},
                                                                    "talker": {"max_tokens": 16}}))
            rows.append({"engine": role, "point": point, "finish_reason": outcome.final.finish_reason,
                         "error_code": outcome.final.error_code, "error": outcome.final.error,
                         "outputs_before_kill": outcome.outputs_before_kill,
                         "kill_to_final_s": outcome.kill_to_final_s, "refusal_s": outcome.refusal_s,
                         "restart_s": restart_s, "served_after_restart": check["final"].finish_reason})
            print(f"{role} {point}: final after {outcome.kill_to_final_s:.3f} s, restarted in {restart_s:.1f} s",
                  flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / ".models/qwen3_omni_tiny"))
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/fault_injection.json"))
    args = parser.parse_args()
    if not (Path(args.model) / "model.safetensors").is_file():
        from vllm_omni.models.qwen3_omni.tiny.checkpoint import build_tiny_checkpoint

        build_tiny_checkpoint(args.model)
    engine = make_engine(load_checkpoint(args.model, bridge_only=True), thinker_backend="vllm",
                         talker_backend="vllm", restart_on_failure=True)
    try:
        rows = asyncio.run(kill_six_ways(engine))
    finally:
        engine.shutdown()
    print(f"\n{'engine':8s} {'kill point':14s} {'final':>6s} {'error_code':>18s} {'kill->final (s)':>16s} "
          f"{'refusal (s)':>12s} {'restart (s)':>12s} {'after':>7s}")
    for row in rows:
        print(f"{row['engine']:8s} {row['point']:14s} {row['finish_reason']:>6s} {row['error_code']!s:>18s} "
              f"{row['kill_to_final_s']:16.3f} {row['refusal_s']:12.4f} {row['restart_s']:12.1f} "
              f"{row['served_after_restart']:>7s}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"kills": rows}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
