"""Unchanged third-party realtime clients against the real server (the tiny checkpoint).

Each client (the `openai` SDK, openai-agents' RealtimeRunner, pipecat's
OpenAIRealtimeLLMService, LiveKit's RealtimeModel session) runs each step in its own
connection: two audio turns, a text-only turn, a greet-first reply from instructions alone,
and a forced tool call round trip. A step passes when its responses complete, as the client
saw them, the client's own hooks (error callbacks, error events, its loggers) caught no
error, and the server sent no `error` event at all: every frame passes through a recording
proxy (tests/framework_clients/proxy.py), so an error the client ignored or never read counts
too. The drivers are in tests/framework_clients/; a client that is not installed is
skipped. scripts/setup.sh installs them (the `frameworks` extra, with websockets' and
protobuf's caps overridden; see there).
"""

from __future__ import annotations

import asyncio
import importlib
from importlib import metadata

import pytest

from tests.framework_clients.common import STEP_TIMEOUT_S, STEPS
from tests.realtime_helpers import MODEL_NAME, sampling_defaults, serving

# client -> (module the driver needs, distribution, pinned version)
CLIENTS = {
    "openai_sdk": ("openai.types.realtime", "openai", "3.57.0"),
    "openai_agents": ("agents.realtime", "openai-agents", "0.24.0"),
    "pipecat": ("pipecat.services.openai.realtime.llm", "pipecat-ai", "1.14.0"),
    "livekit": ("livekit.plugins.openai.realtime", "livekit-plugins-openai", "1.8.9"),
}


@pytest.fixture(scope="module")
def server(vllm_engine):
    """The `make serve` configuration: thinker and talker on vLLM engines (forced tool calls use
    vLLM's structured outputs), code2wav and the bridge in this process; the engines shared with
    the other modules (conftest.py), with room for a forced call's JSON and short answers."""
    answers = {"thinker": {"max_tokens": 96}, "talker": {"max_tokens": 64, "min_tokens": 40}}
    with sampling_defaults(vllm_engine, answers), serving(vllm_engine, borrowed=True) as (url, _engine, _app):
        yield url


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("client", list(CLIENTS))
def test_framework_client(server, client: str, step: str) -> None:
    module, dist, pinned = CLIENTS[client]
    pytest.importorskip(module, reason=f"{dist}=={pinned} is not installed (the frameworks extra; scripts/setup.sh)")
    driver = importlib.import_module(f"tests.framework_clients.{client}")
    coro = driver.run_step(step, server, api_key="sk-test", model=MODEL_NAME)
    outcome = asyncio.run(asyncio.wait_for(coro, STEP_TIMEOUT_S[step] + 60))
    report = outcome.report()
    print(f"{dist} {_version(dist)} (pinned {pinned})\n{report}")
    assert outcome.passed, report
