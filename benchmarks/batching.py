"""Concurrent requests on the torch backend and on the vLLM backend, in one run.

    .venv/bin/python benchmarks/batching.py [--model DIR] [--concurrency 8]

For each backend: the time of one request alone, and the wall time of N identical-size
requests submitted at once; with continuous batching N requests take far less than N times
one. Measured text-only (the thinker's own work) and with speech (thinker + talker +
code2wav; on the vLLM configuration the thinker and the talker are vLLM engines, code2wav
is torch in both). Writes JSON and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vllm_omni.config import get_deploy_config_path, load_deploy_config  # noqa: E402
from vllm_omni.engine import Message, OmniEngine, OmniRequest, RequestFinished  # noqa: E402
from vllm_omni.models.qwen3_omni.checkpoint import load_checkpoint  # noqa: E402
from vllm_omni.models.qwen3_omni.family import Qwen3OmniFamily  # noqa: E402


def request(i: int, modalities: tuple[str, ...], tokens: int) -> OmniRequest:
    return OmniRequest([Message("user", text=f"Question number {i}: tell me about the sea.")],
                       modalities=modalities,
                       sampling={"thinker": {"max_tokens": tokens, "ignore_eos": True},
                                 "talker": {"max_tokens": tokens}})


async def finish(engine: OmniEngine, req: OmniRequest) -> None:
    async for output in engine.generate(req):
        if isinstance(output, RequestFinished) and output.finish_reason not in ("stop", "length"):
            raise RuntimeError(output.error)


async def measure(engine: OmniEngine, modalities: tuple[str, ...], tokens: int, concurrency: int) -> dict:
    await finish(engine, request(-1, modalities, tokens))  # warm-up
    solo = []
    for i in range(3):
        began = time.perf_counter()
        await finish(engine, request(i, modalities, tokens))
        solo.append(time.perf_counter() - began)
    began = time.perf_counter()
    await asyncio.gather(*(finish(engine, request(i, modalities, tokens)) for i in range(concurrency)))
    together = time.perf_counter() - began
    one = statistics.median(solo)
    return {"solo_s": one, "concurrent_s": together, "ratio": together / one}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / ".models/qwen3_omni_tiny"))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/batching.json"))
    args = parser.parse_args()
    if not (Path(args.model) / "model.safetensors").is_file():
        from vllm_omni.models.qwen3_omni.tiny.checkpoint import build_tiny_checkpoint

        build_tiny_checkpoint(args.model)
    checkpoint = load_checkpoint(args.model)
    results = {}
    for backend, config in (("torch", "qwen3_omni_tiny_cpu_torch"), ("vllm", "qwen3_omni_tiny_cpu")):
        deploy = load_deploy_config(get_deploy_config_path(config), platform="cpu")
        engine = OmniEngine(Qwen3OmniFamily(checkpoint, deploy))
        try:
            for label, modalities in (("text", ("text",)), ("speech", ("text", "audio"))):
                results[f"{backend}, {label}"] = asyncio.run(measure(engine, modalities, args.tokens,
                                                                     args.concurrency))
        finally:
            engine.shutdown()
    print(f"\nbackend and output: one request alone vs {args.concurrency} at once "
          f"({args.tokens} tokens each)\n")
    print(f"{'':16s} {'solo (s)':>9s} {f'{args.concurrency} at once (s)':>15s} {'ratio':>7s}")
    for name, row in results.items():
        print(f"{name:16s} {row['solo_s']:9.3f} {row['concurrent_s']:15.3f} {row['ratio']:7.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"concurrency": args.concurrency, "tokens": args.tokens, "results": results},
                              indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
