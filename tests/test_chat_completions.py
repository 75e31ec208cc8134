"""/v1/chat/completions on the torch backend: answers in OpenAI's shapes through the official
SDK, every error path with its status and OpenAI-shaped body, admission shared with realtime
sessions, aborts when the client leaves, and the metrics. The acceptance run on vLLM engines
is tests/test_chat_completions_vllm.py."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import openai
import pytest

from tests.chat_helpers import ask, http_base, sdk, spoken_question, streamed_answer, wait_until, wav_frames
from tests.engine_helpers import make_engine
from tests.realtime_helpers import MODEL_NAME, serving
from tests.test_image_input import picture
from tests.test_tool_calls import WEATHER
from vllm_omni.client.connection import RealtimeConnection
from vllm_omni.client.wav import wav_bytes

KEY = "sk-chat-test"
TEXT = {"modalities": ["text"], "audio": None}
BODY_LIMIT = 200_000


@pytest.fixture(scope="module")
def served(tiny_loaded):
    with serving(make_engine(tiny_loaded)) as running:
        yield running


@pytest.fixture(scope="module")
def guarded(tiny_loaded):
    """One slot, a key and a small body limit."""
    with serving(make_engine(tiny_loaded), api_key=KEY, max_sessions=1, max_request_body_bytes=BODY_LIMIT) as running:
        yield running


def post(url: str, body: object, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(http_base(url) + "/v1/chat/completions", content=content, timeout=60,
                      headers={"content-type": "application/json", **headers})


def test_a_text_question_gets_a_playable_wav_and_its_transcript(served) -> None:
    url, engine, _ = served
    answer = ask(sdk(url), [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}])
    message = answer.choices[0].message
    pcm, rate = wav_frames(message.audio.data)
    assert rate == engine.output_sample_rate and len(pcm) > rate  # more than half a second of speech
    assert message.content is None and message.audio.transcript.strip()
    assert message.audio.id.startswith("audio_") and message.audio.expires_at > answer.created
    usage = answer.usage
    assert usage.completion_tokens == usage.completion_tokens_details.text_tokens + \
        usage.completion_tokens_details.audio_tokens
    assert usage.completion_tokens_details.audio_tokens > 0 and usage.prompt_tokens_details.audio_tokens == 0
    assert answer.choices[0].finish_reason in ("stop", "length") and answer.object == "chat.completion"


def test_a_text_only_answer_streams_as_content(served) -> None:
    url, _, _ = served
    question = [{"role": "user", "content": "Say something."}]
    defaults = {"frequency_penalty": 0, "presence_penalty": 0, "logprobs": False, "response_format": {"type": "text"},
                "n": None}
    whole = sdk(url).chat.completions.create(model=MODEL_NAME, messages=question, max_completion_tokens=12,
                                             **defaults)
    streamed = streamed_answer(sdk(url), question, modalities=["text"], audio=None, max_completion_tokens=12,
                               stream_options={"include_usage": True})
    assert whole.choices[0].message.audio is None
    assert "".join(v for k, v in streamed["pieces"] if k == "content") == whole.choices[0].message.content
    assert streamed["usage"].completion_tokens == whole.usage.completion_tokens == 12
    assert streamed["finish_reason"] == whole.choices[0].finish_reason == "length"


def test_a_stop_string_ends_the_answer_before_it(served) -> None:
    url, _, _ = served
    question = [{"role": "user", "content": "Count to ten."}]
    full = ask(sdk(url), question, max_completion_tokens=24, **TEXT).choices[0].message.content
    stop = full[len(full) // 2:len(full) // 2 + 3]
    stopped = ask(sdk(url), question, max_completion_tokens=24, stop=[stop, "never said"], **TEXT).choices[0]
    assert stopped.message.content == full[:full.index(stop)] and stopped.finish_reason == "stop"


def test_spoken_and_pictured_questions_count_their_tokens(served) -> None:
    url, engine, _ = served
    heard = ask(sdk(url), [spoken_question()], max_completion_tokens=8, **TEXT)
    assert heard.usage.prompt_tokens_details.audio_tokens > 0 and heard.choices[0].message.content
    image = "data:image/png;base64," + base64.b64encode(picture("sun")).decode()
    seen = ask(sdk(url), [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                                       {"type": "text", "text": "What is this?"}]}],
               max_completion_tokens=8, **TEXT)
    assert seen.usage.prompt_tokens_details.image_tokens == 6  # a 96x64 picture: 6 merged patches
    raw = base64.b64encode(b"\x01\x00" * 24000).decode()  # one second of raw 24 kHz pcm16
    pcm = ask(sdk(url), [{"role": "user", "content": [{"type": "input_audio",
                                                       "input_audio": {"data": raw, "format": "pcm16"}}]}],
              max_completion_tokens=8, **TEXT)
    # 100 mel frames: Qwen3-Omni's encoder gives 13 tokens for them, Qwen2.5-Omni's 25
    one_second = {"qwen3_omni": 13, "qwen2_5_omni": 25}[engine.family.name]
    assert pcm.usage.prompt_tokens_details.audio_tokens == one_second


def test_an_earlier_answer_is_referred_to_by_its_audio_id(served) -> None:
    url, _, _ = served
    question = {"role": "user", "content": "Hello there"}
    first = ask(sdk(url), [question], max_completion_tokens=8).choices[0].message.audio
    follow_up = {"role": "user", "content": "And then?"}
    by_id = ask(sdk(url), [question, {"role": "assistant", "audio": {"id": first.id}}, follow_up],
                max_completion_tokens=8, **TEXT)
    by_text = ask(sdk(url), [question, {"role": "assistant", "content": first.transcript}, follow_up],
                  max_completion_tokens=8, **TEXT)
    alone = ask(sdk(url), [follow_up], max_completion_tokens=1, **TEXT)
    assert by_id.usage.prompt_tokens == by_text.usage.prompt_tokens > alone.usage.prompt_tokens
    assert by_id.choices[0].message.content == by_text.choices[0].message.content


ERRORS = {
    "unknown model": ({"model": "nope"}, 404, "model", "model_not_found"),
    "n": ({"n": 2}, 400, "n", "unsupported_value"),
    "mp3 out": ({"modalities": ["text", "audio"], "audio": {"voice": "a", "format": "mp3"}}, 400, "audio.format",
                "unsupported_value"),
    "wav stream": ({"modalities": ["text", "audio"], "audio": {"voice": "a", "format": "wav"}, "stream": True}, 400,
                   "audio.format", "unsupported_value"),
    "no audio params": ({"modalities": ["text", "audio"]}, 400, "audio", "missing_required_parameter"),
    "unknown field": ({"logit_bias_x": 1}, 400, "logit_bias_x", "unknown_parameter"),
    "temperature": ({"temperature": 3}, 400, "temperature", "invalid_value"),
    "stop": ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "invalid_value"),
    "penalty": ({"presence_penalty": 0.5}, 400, "presence_penalty", "unsupported_value"),
    "tool_choice": ({"tool_choice": "bogus"}, 400, "tool_choice", "invalid_value"),
    "seed": ({"seed": 2**64}, 400, "seed", "invalid_value"),
    "wav rate": ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {
        "data": base64.b64encode(wav_bytes(b"\0\0" * 100, 1000)).decode(), "format": "wav"}}]}]},
        400, "messages[0].content[0].input_audio.data", "invalid_value"),
    "json": ({"response_format": {"type": "json_object"}}, 400, "response_format", "unsupported_value"),
    "role": ({"messages": [{"role": "bot", "content": "x"}]}, 400, "messages[0].role", "invalid_value"),
    "part": ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "eA=="}}]}]},
             400, "messages[0].content[0].input_audio.format", "missing_required_parameter"),
    "mp3 in": ({"messages": [{"role": "user", "content": [{"type": "input_audio",
                                                           "input_audio": {"data": "eA==", "format": "mp3"}}]}]},
               400, "messages[0].content[0].input_audio.format", "unsupported_value"),
    "not wav": ({"messages": [{"role": "user", "content": [{"type": "input_audio",
                                                            "input_audio": {"data": "eHh4eA==", "format": "wav"}}]}]},
                400, "messages[0].content[0].input_audio.data", "invalid_value"),
    "remote image": ({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                                 "image_url": {"url": "https://x/y.png"}}]}]},
                     400, "messages[0].content[0].image_url.url", "invalid_value"),
    "unknown audio id": ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "audio": {"id": "a1"}},
                                       {"role": "user", "content": "y"}]},
                         400, "messages[1].audio.id", "invalid_value"),
    "last turn": ({"messages": [{"role": "assistant", "content": "x"}]}, 400, "messages", "invalid_value"),
    "forced call on torch": ({"tools": [{"type": "function", "function": WEATHER}], "tool_choice": "required"}, 400,
                             "tool_choice", "invalid_value"),
    "bad tool schema": ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]}, 400,
                        "tools[0].parameters", "invalid_value"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_a_bad_request_is_refused_naming_the_parameter(served, case: str) -> None:
    url, engine, _ = served
    fields, status, param, code = ERRORS[case]
    refused = post(url, {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], **fields})
    error = refused.json()["error"]
    assert (refused.status_code, error["param"], error["code"]) == (status, param, code), error
    assert error["type"] == "invalid_request_error" and error["message"]
    assert engine.num_active_requests() == 0
    assert ask(sdk(url), [{"role": "user", "content": "Hi"}], max_completion_tokens=2, **TEXT).choices  # goes on


def test_the_sdk_raises_its_own_error_classes(served) -> None:
    url, _, _ = served
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        sdk(url).chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        sdk(url).chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}], n=3)
    assert post(url, b"{not json").json()["error"]["code"] == "invalid_json"
    wrong_method = httpx.get(http_base(url) + "/v1/chat/completions")
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["message"] == "Method Not Allowed"


def test_key_body_limit_and_shared_slots(guarded) -> None:
    url, _, _ = guarded
    question = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 2}
    with pytest.raises(openai.AuthenticationError):
        sdk(url, api_key="wrong").chat.completions.create(**question)
    big = {**question, "messages": [{"role": "user", "content": "x" * BODY_LIMIT}]}
    too_big = post(url, big, authorization=f"Bearer {KEY}")
    assert (too_big.status_code, too_big.json()["error"]["code"]) == (413, "request_too_large")
    assert sdk(url, api_key=KEY).chat.completions.create(**question).choices

    async def while_a_realtime_session_holds_the_only_slot() -> httpx.Response:
        conn = await RealtimeConnection.open(url + "/v1/realtime", headers={"Authorization": f"Bearer {KEY}"})
        try:
            return await asyncio.to_thread(post, url, question, authorization=f"Bearer {KEY}")
        finally:
            await conn.close()

    full = asyncio.run(while_a_realtime_session_holds_the_only_slot())
    assert (full.status_code, full.json()["error"]["type"]) == (429, "rate_limit_error")
    wait_until(lambda: post(url, question, authorization=f"Bearer {KEY}").status_code == 200, 5)


def test_a_busy_engine_and_a_dead_stage(served, monkeypatch) -> None:
    url, engine, _ = served
    question = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}]}
    monkeypatch.setattr(engine, "max_requests", 0)
    busy = post(url, question)
    assert (busy.status_code, busy.json()["error"]["code"]) == (429, "rate_limit_exceeded")
    monkeypatch.undo()
    monkeypatch.setattr(engine, "unhealthy_stages", lambda: ["talker"])
    dead = post(url, question)
    assert (dead.status_code, dead.json()["error"]["type"], dead.json()["error"]["code"]) == \
        (503, "server_error", "stage_unavailable")
    monkeypatch.undo()
    assert post(url, {**question, "max_completion_tokens": 2}).status_code == 200


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_stops_its_engine_request(served, stream: bool) -> None:
    url, engine, _ = served
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Tell me everything."}],
            "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16" if stream else "wav"},
            "stream": stream}
    with httpx.Client(timeout=httpx.Timeout(60, read=0.5)) as client:
        if stream:
            with client.stream("POST", http_base(url) + "/v1/chat/completions", json=body) as response:
                lines = response.iter_lines()
                assert next(line for line in lines if line.startswith("data:"))
                assert engine.num_active_requests() == 1
        else:
            with pytest.raises(httpx.ReadTimeout):
                client.post(http_base(url) + "/v1/chat/completions", json=body)
            assert engine.num_active_requests() == 1
    wait_until(lambda: engine.num_active_requests() == 0, 1.0)


def test_metrics_count_requests_by_endpoint_and_status(served) -> None:
    url, _, _ = served
    ask(sdk(url), [{"role": "user", "content": "Hi"}], max_completion_tokens=4)  # spoken: TTFP observed
    post(url, {"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    text = httpx.get(http_base(url) + "/metrics").text
    assert 'vllm_omni_http_requests_total{endpoint="chat_completions",status="200"}' in text
    assert 'vllm_omni_http_requests_total{endpoint="chat_completions",status="404"}' in text
    for histogram in ("ttft", "ttfp"):
        count = next(line for line in text.splitlines()
                     if line.startswith(f'vllm_omni_http_{histogram}_seconds_count{{endpoint="chat_completions"}}'))
        assert float(count.split()[-1]) >= 1
    assert 'vllm_omni_http_active_requests{endpoint="chat_completions"} 0.0' in text
