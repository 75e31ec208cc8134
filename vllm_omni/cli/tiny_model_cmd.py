"""`vllm-omni make-tiny-model`: write a tiny random-weight checkpoint of a real architecture."""

from __future__ import annotations

import argparse
import importlib

# --arch → the module whose `build_tiny_checkpoint(out_dir, seed)` builds it
BUILDERS = {
    "qwen3_omni_moe": "vllm_omni.models.qwen3_omni.tiny.checkpoint",
    "minicpmo_4_5": "vllm_omni.models.minicpmo.tiny.checkpoint",
    "moshi": "vllm_omni.models.moshi.tiny.checkpoint",
    "qwen2_5_omni": "vllm_omni.models.qwen2_5_omni.tiny.checkpoint",
}


def register(commands: argparse._SubParsersAction) -> None:
    tiny = commands.add_parser(
        "make-tiny-model",
        help="build a tiny random-weight checkpoint (for CPU development and tests)")
    tiny.add_argument("--arch", choices=list(BUILDERS), default="qwen3_omni_moe")
    tiny.add_argument("--out", required=True, help="output directory")
    tiny.add_argument("--seed", type=int, default=0, help="weight seed (same seed, same bytes)")
    tiny.set_defaults(run=make_tiny_model)


def make_tiny_model(args: argparse.Namespace) -> int:
    out = importlib.import_module(BUILDERS[args.arch]).build_tiny_checkpoint(args.out, seed=args.seed)
    print(f"wrote tiny {args.arch} checkpoint to {out}")
    return 0
