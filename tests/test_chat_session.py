"""The session layer of /v1/chat/completions against a scripted engine (a test double): the
deadline, a failure after the stream started, an engine refusal, and the answer store."""

from __future__ import annotations

import asyncio

import pytest

from tests.scripted_engine import Audio, Finish, Raise, ScriptedEngine, Stall, Text
from vllm_omni.engine.request import EngineBusyError, FinishReason
from vllm_omni.protocol.chat_completions import ChatRequestError, parse_chat_request
from vllm_omni.session.answer_audio import AnswerAudioStore
from vllm_omni.session.chat_completion import ChatCompletion

SPOKEN = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "modalities": ["text", "audio"],
          "audio": {"voice": "Bruno", "format": "pcm16"}}


async def completion(engine: ScriptedEngine, store: AnswerAudioStore | None = None, timeout_s: float = 5.0,
                     **fields) -> ChatCompletion:
    request, messages = parse_chat_request({**SPOKEN, **fields})
    return ChatCompletion(engine, request, messages, store or AnswerAudioStore(), timeout_s)


def test_an_answer_past_its_deadline_is_a_timeout() -> None:
    engine = ScriptedEngine(default=(Stall(),))

    async def scenario() -> None:
        chat = await completion(engine, timeout_s=0.2)
        with pytest.raises(ChatRequestError) as refused:
            await chat.start()
        await chat.close()
        assert (refused.value.status, refused.value.code) == (504, "timeout")

    asyncio.run(scenario())


def test_a_failure_mid_stream_is_the_last_chunk() -> None:
    failing = (Text("Hi"), Audio(100), Finish(FinishReason.ERROR, error="talker died", error_code="stage_unavailable"))
    engine = ScriptedEngine(default=failing)

    async def scenario() -> tuple[list[dict], ChatRequestError]:
        chat = await completion(engine, stream=True)
        await chat.start()
        chunks = [piece async for piece in chat.chunks()]
        whole = await completion(engine)
        await whole.start()
        with pytest.raises(ChatRequestError) as failed:
            await whole.complete()
        return chunks, failed.value

    chunks, failed = asyncio.run(scenario())
    assert [list(c["choices"][0]["delta"]) for c in chunks[1:-1]] == [["audio"], ["audio"]]
    assert chunks[-1] == {"error": {"message": "the answer failed: talker died", "type": "server_error",
                                    "param": None, "code": "stage_unavailable"}}
    assert (failed.status, failed.code) == (503, "stage_unavailable")


def test_a_busy_engine_is_a_429_and_a_known_voice_is_used() -> None:
    engine = ScriptedEngine(queued=[(Raise(EngineBusyError("engine is at capacity (8 requests); retry later")),)])

    async def scenario() -> ChatRequestError:
        chat = await completion(engine)
        with pytest.raises(ChatRequestError) as refused:
            await chat.start()
        await chat.close()
        return refused.value

    refused = asyncio.run(scenario())
    assert (refused.status, refused.code) == (429, "rate_limit_exceeded")
    assert engine.requests[0].speaker == "bruno"


def test_a_prompt_cache_key_keeps_requests_on_the_same_replicas() -> None:
    engine = ScriptedEngine()

    async def ask(**fields) -> None:
        chat = await completion(engine, **fields)
        await chat.start()
        await chat.close()

    asyncio.run(ask(prompt_cache_key="caller-7"))
    asyncio.run(ask())
    assert [r.affinity_key for r in engine.requests] == ["caller-7", None]


def test_answers_are_kept_for_their_ttl_and_oldest_go_first() -> None:
    engine, store = ScriptedEngine(), AnswerAudioStore(ttl_s=60, max_answers=2)

    async def answer() -> dict:
        chat = await completion(engine, store, audio={"voice": "x", "format": "wav"})
        await chat.start()
        return await chat.complete()

    ids = [asyncio.run(answer())["choices"][0]["message"]["audio"]["id"] for _ in range(3)]
    assert [store.transcript(i) for i in ids] == [None, "Hello there.", "Hello there."]
    expired = AnswerAudioStore(ttl_s=-1)
    expired.keep("audio_1", "said", expired.expires_at())
    assert expired.transcript("audio_1") is None
