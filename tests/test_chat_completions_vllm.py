"""/v1/chat/completions on the tiny checkpoint with thinker and talker on vLLM CPU engines,
driven by the official `openai` SDK: spoken answers whole and streamed, the stream equal to
the whole answer, a client that leaves, a forced tool call, and chat requests sharing the
server with realtime sessions."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import numpy as np
import pytest

from tests.chat_helpers import ask, http_base, sdk, spoken_question, streamed_answer, wait_until, wav_frames
from tests.realtime_helpers import MODEL_NAME, fixture_pcm, serving
from tests.test_image_input import picture
from tests.test_tool_calls import WEATHER
from vllm_omni.client.turns import run_session

GREEDY = {"temperature": 0, "max_completion_tokens": 24}


@pytest.fixture(scope="module")
def served(vllm_engine):
    with serving(vllm_engine, borrowed=True) as running:  # later modules use the engines too
        yield running


def test_questions_in_text_audio_and_pictures_are_answered_with_speech(served) -> None:
    url, engine, _ = served
    client = sdk(url)
    image = "data:image/png;base64," + base64.b64encode(picture("sun")).decode()
    questions = {"text": [{"role": "user", "content": "Hello, who are you?"}],
                 "audio": [spoken_question()],
                 "image": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                                        {"type": "text", "text": "What is this?"}]}]}
    for kind, messages in questions.items():
        answer = ask(client, messages, **GREEDY)
        audio = answer.choices[0].message.audio
        pcm, rate = wav_frames(audio.data)
        assert rate == engine.output_sample_rate and np.abs(np.frombuffer(pcm, "<i2")).max() > 100, kind
        assert audio.transcript.strip(), kind
    assert answer.usage.prompt_tokens_details.image_tokens > 0
    follow_up = [*questions["text"], {"role": "assistant", "audio": {"id": audio.id}},
                 {"role": "user", "content": "Tell me more."}]
    second = ask(client, follow_up, **GREEDY)
    assert second.choices[0].message.audio.transcript.strip() and wav_frames(second.choices[0].message.audio.data)[0]


def test_the_stream_speaks_while_it_writes_and_equals_the_whole_answer(served) -> None:
    url, _, _ = served
    question = [spoken_question()]
    whole = ask(sdk(url), question, **{**GREEDY, "audio": {"voice": "alloy", "format": "pcm16"}})
    streamed = streamed_answer(sdk(url), question, **GREEDY, stream_options={"include_usage": True})
    kinds = [kind for kind, _ in streamed["pieces"]]
    last_transcript = len(kinds) - 1 - kinds[::-1].index("transcript")
    assert kinds.index("audio") < last_transcript  # audio starts before the text is complete
    ours = np.frombuffer(streamed["pcm"], "<i2").astype(int)
    reference = np.frombuffer(base64.b64decode(whole.choices[0].message.audio.data), "<i2").astype(int)
    assert len(ours) == len(reference) > 0 and np.abs(ours - reference).max() <= 1
    assert streamed["transcript"] == whole.choices[0].message.audio.transcript
    assert streamed["usage"].completion_tokens == whole.usage.completion_tokens


def test_a_client_that_leaves_mid_stream_frees_the_engine_within_a_second(served) -> None:
    url, engine, _ = served
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Tell me everything."}],
            "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}, "stream": True}
    with httpx.Client(timeout=60) as client, \
            client.stream("POST", http_base(url) + "/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if '"data"' in line:  # the first audio piece: thinker and talker both hold the request
                break
        assert engine.num_active_requests() == 1
    wait_until(lambda: engine.num_active_requests() == 0, 1.0)


def test_a_forced_tool_call_comes_back_as_tool_calls(served) -> None:
    url, _, _ = served
    city = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"],
            "additionalProperties": False}
    tool = {"type": "function", "function": {**WEATHER, "parameters": city}}
    # the tiny tokenizer spells JSON about a character a token: room for the whole call
    answer = ask(sdk(url), [{"role": "user", "content": "Weather in Paris?"}], modalities=["text"], audio=None,
                 tools=[tool], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                 max_completion_tokens=200)
    (call,) = answer.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
    assert answer.choices[0].finish_reason == "tool_calls" and answer.choices[0].message.content == ""


def test_chat_streams_and_realtime_sessions_share_the_server(served) -> None:
    url, engine, _ = served
    question = fixture_pcm("speech_en_single.wav")

    async def together():
        streams = [asyncio.to_thread(streamed_answer, sdk(url), [spoken_question()], **GREEDY) for _ in range(8)]
        sessions = [run_session(url + "/v1/realtime", question, realtime=False) for _ in range(4)]
        return await asyncio.wait_for(asyncio.gather(*streams, *sessions), 600)

    results = asyncio.run(together())
    chats, sessions = results[:8], results[8:]
    assert all(chat["finish_reason"] in ("stop", "length") and chat["pcm"] and chat["transcript"] for chat in chats)
    assert all(not s.errors and s.turns[0].response.status == "completed" for s in sessions)
    assert len({chat["pcm"] for chat in chats}) == 1  # the same greedy answer, however it was batched
    metrics = httpx.get(http_base(url) + "/metrics").text
    assert 'vllm_omni_http_requests_total{endpoint="chat_completions",status="200"}' in metrics
    assert 'vllm_omni_realtime_responses_total{status="completed"}' in metrics
    wait_until(lambda: engine.num_active_requests() == 0, 5.0)
