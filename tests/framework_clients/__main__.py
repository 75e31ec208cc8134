"""python -m tests.framework_clients CLIENT WS_URL [STEP ...] [--model NAME] [--api-key KEY]

Runs one client's steps against a running server (e.g. `make serve`: ws://127.0.0.1:8000)
and prints each step's outcome: failed checks, client-side errors, what went each way.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys

from tests.framework_clients.common import STEPS

CLIENTS = ("openai_sdk", "openai_agents", "pipecat", "livekit")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.framework_clients")
    parser.add_argument("client", choices=CLIENTS)
    parser.add_argument("ws_url", help="the server's base URL, e.g. ws://127.0.0.1:8000")
    parser.add_argument("steps", nargs="*", help=f"any of {', '.join(STEPS)} (default: all)")
    parser.add_argument("--model", default="qwen3-omni-tiny")
    parser.add_argument("--api-key", default="unused")
    args = parser.parse_args()
    if unknown := set(args.steps) - set(STEPS):
        parser.error(f"unknown steps {sorted(unknown)}; choose from {STEPS}")
    driver = importlib.import_module(f"tests.framework_clients.{args.client}")
    failed = 0
    for step in args.steps or STEPS:
        outcome = asyncio.run(driver.run_step(step, args.ws_url, api_key=args.api_key, model=args.model))
        print(outcome.report(), flush=True)
        failed += not outcome.passed
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
