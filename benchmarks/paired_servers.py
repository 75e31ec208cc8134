"""A lever's effect, measured in paired runs: two server variants in ABBA order, same load.

    .venv/bin/python benchmarks/paired_servers.py --model .models/qwen3_omni_tiny \\
        --a before=670c2f2:configs/qwen3_omni_tiny_cpu.yaml --b after=.:configs/qwen3_omni_tiny_cpu.yaml \\
        --sessions 1,8 --turns 3 --arrival-spread-s 5 --wav tests/data/speech_en_single.wav \\
        --out paired.json

A variant is `LABEL=REF:CONFIG`: the server runs the code of git ref REF (checked out into a
temporary worktree; `.` is this working tree) with deploy config CONFIG (a path inside that
tree). Each round starts and measures the variants in the order A B B A, one server at a time
on the same port, so slow drift of the machine (thermal, other load) weighs on both alike. Every
run measures every `--sessions` level with `vllm-omni bench realtime`'s load (bench/realtime.py,
this tree's client). Per variant and level, the answers of all its runs are pooled: TTFP,
playable start, RTF, stalls at 0 / 60 / 120 ms of playout buffer, and each level's playable-start
p95 over the one-session level's. Writes JSON (every run's rows too) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vllm_omni.bench.realtime import playback_figures, run_level, stalls_cell  # noqa: E402
from vllm_omni.client.barge_in import CANCELLED  # noqa: E402
from vllm_omni.client.timing import summarize  # noqa: E402
from vllm_omni.client.url import realtime_url  # noqa: E402
from vllm_omni.client.wav import read_pcm16  # noqa: E402

HEALTH_TIMEOUT_S = 600.0  # two vLLM engines start in about a minute each on 2 cores
STOP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Variant:
    label: str
    ref: str  # a git ref, or "." for the working tree
    config: str  # deploy config, relative to the variant's tree


def parse_variant(text: str) -> Variant:
    label, _, rest = text.partition("=")
    ref, _, config = rest.partition(":")
    if not (label and ref and config):
        raise argparse.ArgumentTypeError(f"expected LABEL=REF:CONFIG, got {text!r}")
    return Variant(label, ref, config)


@contextmanager
def checked_out(ref: str):
    """The tree of `ref`: this working tree for ".", else a temporary detached worktree."""
    if ref == ".":
        yield REPO
        return
    with tempfile.TemporaryDirectory(prefix="paired-") as parent:
        tree = Path(parent) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), ref], cwd=REPO, check=True,
                       capture_output=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)


@contextmanager
def serving(tree: Path, config: str, model: Path, port: int, log: Path):
    """A server of `tree`'s code on `port`, healthy, stopped (SIGINT, then SIGKILL) on exit."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "vllm_omni.cli.main", "serve", str(model), "--deploy-config", config,
             "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "paired"],
            cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(port, server, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def wait_healthy(port: int, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited ({server.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"the server was not healthy after {HEALTH_TIMEOUT_S:.0f} s; see {log}")


def pooled(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's figures at one level, over the per-turn rows of all its runs."""
    played = [row for row in rows if row["status"] != CANCELLED]
    return {
        "answers": len(rows),
        "ttfp_ms": summarize(row["ttfp_ms"] for row in rows),
        "playable_start_ms": summarize(row["playable_start_ms"] for row in rows),
        "rtf": summarize(row["rtf"] for row in played),
        **playback_figures(played),
        "failed": sum(1 for row in rows if row["status"] != "completed"),
    }


def summarize_variant(runs: list[dict[int, dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    """Per level: pooled figures, plus the playable-start p95 over the one-session level's."""
    levels = sorted({level for run in runs for level in run})
    figures = {level: pooled([row for run in runs for row in run[level]["per_turn"]]) for level in levels}
    single = figures.get(1, {}).get("playable_start_ms", {}).get("p95")
    for row in figures.values():
        p95 = row["playable_start_ms"]["p95"]
        row["playable_start_p95_vs_1"] = round(p95 / single, 3) if single and p95 is not None else None
    for level in levels:
        figures[level]["failed_sessions"] = sum(run[level]["failed_sessions"] for run in runs)
        figures[level]["error_events"] = sum(run[level]["error_events"] for run in runs)
    return figures


def format_table(summary: dict[str, dict[int, dict[str, Any]]]) -> str:
    def cell(value: Any, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [f"{'variant':12s} {'sessions':>8s} {'answers':>7s} {'TTFP p50':>9s} {'TTFP p95':>9s} {'play p50':>9s} "
             f"{'play p95':>9s} {'p95 / 1':>7s} {'RTF p95':>8s} {'stalls@0/60/120':>16s} {'errors':>6s}"]
    for label, levels in summary.items():
        for level, row in levels.items():
            lines.append(
                f"{label:12s} {level:8d} {row['answers']:7d} {cell(row['ttfp_ms']['p50']):>9s} "
                f"{cell(row['ttfp_ms']['p95']):>9s} {cell(row['playable_start_ms']['p50']):>9s} "
                f"{cell(row['playable_start_ms']['p95']):>9s} {cell(row['playable_start_p95_vs_1'], 2):>7s} "
                f"{cell(row['rtf']['p95'], 3):>8s} {stalls_cell(row):>16s} "
                f"{row['error_events'] + row['failed_sessions'] + row['failed']:6d}")
    return "\n".join(lines)


def measure(url: str, pcm: bytes, levels: list[int], turns: int, spread_s: float) -> dict[int, dict[str, Any]]:
    return {level: asyncio.run(run_level(realtime_url(url), pcm, level, turns, arrival_spread_s=spread_s))
            for level in levels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="checkpoint folder")
    parser.add_argument("--a", type=parse_variant, required=True, help="LABEL=REF:CONFIG (the baseline)")
    parser.add_argument("--b", type=parse_variant, required=True, help="LABEL=REF:CONFIG (the lever)")
    parser.add_argument("--sessions", default="1,8", help="concurrency levels (default 1,8)")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--arrival-spread-s", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=1, help="ABBA rounds (default 1: A B B A)")
    parser.add_argument("--wav", default=str(REPO / "tests/data/speech_en_single.wav"))
    parser.add_argument("--port", type=int, default=8300)
    parser.add_argument("--out", type=Path, required=True, help="JSON results (server logs beside it)")
    args = parser.parse_args()
    levels = [int(part) for part in args.sessions.split(",")]
    pcm = read_pcm16(args.wav)
    model = args.model.resolve()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[int, dict[str, Any]]]] = {args.a.label: [], args.b.label: []}
    with ExitStack() as stack:
        trees = {variant.label: stack.enter_context(checked_out(variant.ref)) for variant in (args.a, args.b)}
        order = [args.a, args.b, args.b, args.a] * args.rounds
        for index, variant in enumerate(order, 1):
            print(f"run {index}/{len(order)}: {variant.label} ({variant.ref}, {variant.config})…", file=sys.stderr,
                  flush=True)
            log = args.out.with_name(f"{args.out.stem}-server-{index}-{variant.label}.log")
            with serving(trees[variant.label], variant.config, model, args.port, log) as url:
                runs[variant.label].append(measure(url, pcm, levels, args.turns, args.arrival_spread_s))
    summary = {label: summarize_variant(variant_runs) for label, variant_runs in runs.items()}
    settings = {"a": vars(args.a), "b": vars(args.b), "levels": levels, "turns": args.turns,
                "arrival_spread_s": args.arrival_spread_s, "rounds": args.rounds, "order": "ABBA",
                "wav": args.wav, "model": str(model)}
    args.out.write_text(json.dumps({"settings": settings, "summary": summary, "runs": runs}, indent=2))
    print(format_table(summary))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
