"""The project's end-to-end scenarios, written for Qwen3-Omni, against the tiny Qwen2.5-Omni
deploy with its thinker on vLLM (configs/qwen2_5_omni_tiny_cpu.yaml) over real sockets: the GA
lane (server VAD turns, barge-in, cancel, history and close, the official SDK, out-of-band
responses), the duplex lane in turn-based mode (a dropped socket resumed, the client),
/v1/chat/completions with spoken and pictured questions, tools in the prompt and a forced tool
call. Each scenario is the imported test itself, given this module's fixtures. The
spec-written suites run on this model's torch deploy (the `turn_model` fixture,
tests/conftest.py), with every error case of both lanes."""

from __future__ import annotations

import pytest

from tests.realtime_helpers import sampling_defaults, serving
from tests.test_chat_completions import (  # noqa: F401 (collected here, on this module's fixtures)
    test_a_text_question_gets_a_playable_wav_and_its_transcript,
    test_an_earlier_answer_is_referred_to_by_its_audio_id,
    test_spoken_and_pictured_questions_count_their_tokens,
)
from tests.test_duplex_client import (  # noqa: F401
    test_a_dropped_socket_resumes_and_every_event_arrives_once,
    test_client_cli_on_the_duplex_lane,
)
from tests.test_realtime_ga_lane import (  # noqa: F401
    test_barge_in_cancels_the_response_and_starts_the_next_turn,
    test_openai_sdk_completes_a_turn,
    test_out_of_band_response_stays_out_of_the_history,
    test_response_cancel_mid_stream,
    test_server_vad_two_turns,
    test_text_item_history_and_session_close,
)
from tests.test_tool_calls import (  # noqa: F401
    test_tools_and_results_reach_the_prompt_as_the_template_writes_them,
)
from tests.test_vllm_backend import (  # noqa: F401
    test_a_forced_tool_call_is_json_of_the_tools_schema_and_nothing_is_spoken,
)

# Answers long enough to speak over (a code is 20 ms), short enough for a 2-core machine.
ANSWERS = {"thinker": {"max_tokens": 24}, "talker": {"max_tokens": 100, "min_tokens": 60}}


@pytest.fixture(scope="module")
def engine(qwen2_5_omni_vllm_engine):
    with sampling_defaults(qwen2_5_omni_vllm_engine, ANSWERS):
        yield qwen2_5_omni_vllm_engine


@pytest.fixture(scope="module")
def vllm_engine(engine):
    """The forced-call scenario's engine: this deploy's."""
    return engine


@pytest.fixture(scope="module")
def server(engine):
    """The GA lane: (ws URL, engine)."""
    with serving(engine, borrowed=True) as (url, served, _):
        yield url, served


@pytest.fixture(scope="module")
def server_url(engine):
    """The duplex lane, turn-based: its http URL."""
    with serving(engine, borrowed=True, session_mode="duplex") as (url, _, _):
        yield url.replace("ws://", "http://")


@pytest.fixture(scope="module")
def served(engine):
    with serving(engine, borrowed=True) as running:
        yield running
