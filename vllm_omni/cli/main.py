"""`vllm-omni` entry point: one sub-command per job, heavy imports only when a job runs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from vllm_omni.cli import bench_cmd, client_cmd, config_cmd, serve_cmd, tiny_model_cmd


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-omni",
        description="Realtime serving stack for omni models (Qwen3-Omni, MiniCPM-o).")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve_cmd.register(commands)
    tiny_model_cmd.register(commands)
    config_cmd.register(commands)
    client_cmd.register(commands)
    bench_cmd.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
