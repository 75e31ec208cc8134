"""The HTTP chat client (client/chat.py), `vllm-omni client --chat` and `bench realtime
--endpoint chat`: URL and argument checks, and end to end against the transformers baseline's
`POST /v1/chat/completions` on the tiny checkpoint."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import wave
from pathlib import Path
from types import SimpleNamespace

import openai
import pytest

from tests.conftest import audio_fixture_path
from tests.realtime_helpers import fixture_pcm
from vllm_omni.cli.main import main
from vllm_omni.client.chat import ChatTurn, _collect, stream_chat, user_message
from vllm_omni.client.url import chat_base_url

QUESTION = "speech_en_single.wav"


@pytest.mark.parametrize(("base", "expected"), [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1"),
    ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1"),
    ("ws://host:8000/v1/realtime?model=m", "http://host:8000/v1"),
    ("wss://host/v1/realtime", "https://host/v1"),
    ("https://host/omni", "https://host/omni/v1"),
    ("http://host:8000/v1/chat/completions", "http://host:8000/v1"),
])
def test_chat_base_url(base: str, expected: str) -> None:
    assert chat_base_url(base) == expected


@pytest.mark.parametrize("base", ["ftp://host", "host:8000", "http://"])
def test_chat_base_url_rejects_what_is_no_server(base: str) -> None:
    with pytest.raises(ValueError):
        chat_base_url(base)


def test_user_message_sends_the_speech_as_a_wav_part() -> None:
    pcm = fixture_pcm(QUESTION)
    parts = user_message(pcm, "and briefly", "data:image/png;base64,AAAA")["content"]
    assert [part["type"] for part in parts] == ["image_url", "input_audio", "text"]
    assert parts[1]["input_audio"]["format"] == "wav"
    with wave.open(io.BytesIO(base64.b64decode(parts[1]["input_audio"]["data"]))) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 16000)
        assert wav.readframes(wav.getnframes()) == pcm
    with pytest.raises(ValueError):
        user_message()


@pytest.mark.parametrize("typed", [True, False])
def test_audio_deltas_as_typed_fields_or_extras(typed: bool) -> None:
    """Newer SDKs type `delta.audio`; older ones keep it as an extra dict."""
    def chunk(audio: dict | None, usage: dict | None = None, finish: str | None = None) -> SimpleNamespace:
        delta = SimpleNamespace(content=None, audio=SimpleNamespace(**audio) if typed and audio else audio)
        choices = [] if usage else [SimpleNamespace(delta=delta, finish_reason=finish)]
        return SimpleNamespace(choices=choices, usage=usage and SimpleNamespace(model_dump=lambda **_: usage))

    async def stream():
        for item in [chunk({"id": "audio_1", "transcript": "Hi", "data": None}),
                     chunk({"id": "audio_1", "transcript": None, "data": base64.b64encode(b"\1\0" * 240).decode()}),
                     chunk(None, finish="stop"), chunk(None, usage={"total_tokens": 3})]:
            yield item

    turn = ChatTurn(model="m")
    asyncio.run(_collect(stream(), turn, 0.0))
    assert (turn.transcript, turn.audio_id, turn.chunk_count, turn.finish_reason) == ("Hi", "audio_1", 1, "stop")
    assert turn.audio_duration_ms == 10 and turn.usage == {"total_tokens": 3}
    assert turn.assistant_message == {"role": "assistant", "audio": {"id": "audio_1"}}


def _client(tmp_path: Path, *extra: str) -> list[str]:
    return ["client", "--url", "http://127.0.0.1:9", "--wav", str(audio_fixture_path(QUESTION)),
            "--out", str(tmp_path / "answer.wav"), *extra]


@pytest.mark.parametrize(("extra", "named"), [
    (["--chat", "--duplex"], "--duplex"), (["--chat", "--server-vad"], "--server-vad"),
    (["--chat", "--native", "--duplex"], "--native"), (["--chat", "--turns", "0"], "--turns"),
    (["--chat", "--max-tokens", "0"], "--max-tokens"), (["--text", "hi"], "--text"),
    (["--voice", "Ethan"], "--voice"), (["--chat", "--image", "missing.png"], "missing.png"),
])
def test_client_chat_bad_input_exits_2(extra: list[str], named: str, tmp_path: Path, capsys) -> None:
    assert main(_client(tmp_path, *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and named in err and err.count("\n") == 1


def test_client_chat_unreachable_server_is_one_line(tmp_path: Path, capsys) -> None:
    assert main(_client(tmp_path, "--chat")) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: http://127.0.0.1:9/v1: ") and err.count("\n") == 1


@pytest.mark.parametrize("flag", [["--server-vad"], ["--duplex"], ["--barge-in"], ["--compare-transcription"]])
def test_bench_chat_rejects_realtime_only_flags(flag: list[str], tmp_path: Path, capsys) -> None:
    code = main(["bench", "realtime", "--endpoint", "chat", "--no-baseline", "--url", "http://127.0.0.1:9",
                 "--wav", str(audio_fixture_path(QUESTION)), "--out-dir", str(tmp_path / "bench"), *flag])
    err = capsys.readouterr().err
    assert code == 2 and flag[0] in err and "--endpoint chat" in err and err.count("\n") == 1
    assert not (tmp_path / "bench").exists()


@pytest.fixture(scope="module")
def baseline(tiny_checkpoint: Path):
    """The transformers baseline on the tiny checkpoint, short answers; its base URL."""
    from vllm_omni.bench.baseline_server import BaselineSettings, running_baseline

    with running_baseline(str(tiny_checkpoint), BaselineSettings(8, 24)) as base:
        yield base


def test_stream_chat_against_the_baseline(baseline: str) -> None:
    turn = asyncio.run(stream_chat(chat_base_url(baseline), wav_pcm16=fixture_pcm(QUESTION)))
    assert turn.transcript and turn.pcm and len(turn.pcm) % 2 == 0
    assert turn.audio_duration_ms == len(turn.pcm) * 1000 / 48000
    assert turn.chunk_count == math.ceil(len(turn.pcm) / 24000)  # the baseline's 0.5 s pieces
    assert turn.ttft_ms is not None and turn.ttfp_ms is not None and turn.ttft_ms <= turn.ttfp_ms <= turn.total_ms
    assert turn.rtf is not None and turn.rtf > 0
    assert turn.finish_reason == "stop" and turn.usage["completion_tokens"] > 0
    assert turn.model == "transformers-baseline"
    assert turn.messages[-1] == {"role": "assistant", "audio": {"id": turn.audio_id}}

    async def whole(audio_format: str, stream: bool):
        async with openai.AsyncOpenAI(base_url=chat_base_url(baseline), api_key="EMPTY", max_retries=0) as client:
            return await client.chat.completions.create(
                model=turn.model, messages=turn.messages[:-1], modalities=["text", "audio"],
                audio={"voice": "Ethan", "format": audio_format}, stream=stream)

    completion = asyncio.run(whole("wav", False))  # greedy: the same answer, as a WAV
    with wave.open(io.BytesIO(base64.b64decode(completion.choices[0].message.audio.data))) as wav:
        assert wav.getframerate() == 24000 and wav.readframes(wav.getnframes()) == turn.pcm
    assert completion.choices[0].message.audio.transcript == turn.transcript
    with pytest.raises(openai.BadRequestError, match="pcm16"):
        asyncio.run(whole("wav", True))


def test_client_chat_two_turns(baseline: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "answer.wav"
    code = main(["client", "--chat", "--url", baseline, "--wav", str(audio_fixture_path(QUESTION)),
                 "--out", str(out), "--turns", "2", "--text", "Answer briefly."])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "turn 1:" in printed and "turn 2:" in printed and "TTFP ms" in printed
    with wave.open(str(out)) as wav:
        assert wav.getframerate() == 24000 and wav.getnframes() > 0


def test_bench_chat_endpoint(baseline: str, tmp_path: Path, capsys) -> None:
    out_dir = tmp_path / "bench"
    code = main(["bench", "realtime", "--endpoint", "chat", "--no-baseline", "--url", baseline,
                 "--sessions", "1", "--turns", "1", "--wav", str(audio_fixture_path(QUESTION)),
                 "--out-dir", str(out_dir)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    written = json.loads((out_dir / "results.json").read_text())
    assert written["settings"]["endpoint"] == "chat"
    assert written["settings"]["targets"] == {"vllm-omni": chat_base_url(baseline)}
    [row] = written["results"]["vllm-omni"]
    assert (row["turns"], row["completed_turns"], row["failed_sessions"]) == (1, 1, 0), row["failures"]
    assert row["ttfp_ms"]["count"] == 1 and row["rtf"]["count"] == 1
    assert (out_dir / "ttfp_rtf_vs_sessions.png").is_file()
