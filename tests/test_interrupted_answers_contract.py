"""Interrupted answers finish every part they started, and answers mark their end (docs/realtime-api.md
§5.4, §6.5): against real servers on the tiny checkpoints, every way an answer is interrupted —
`response.cancel`, `output_audio_buffer.clear`, `input.cancel` and a server-VAD barge-in — ends it
with the `*.done` block whose transcript is exactly what was sent as deltas, while the conversation
keeps only the part that was played; and the last audio delta of a completed Qwen3-Omni answer is
the one with `end_of_turn` true.

The Qwen3-Omni duplex lane runs on configs/qwen3_omni_tiny_cpu_duplex.yaml (torch) and on the vLLM
stages (the `vllm_engine` fixture); the GA lane on the same torch engine in turn mode; the native
lane on the tiny MiniCPM-o vLLM deploy (configs/minicpmo_4_5_tiny_cpu.yaml)."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.ga_conformance import ga_problems
from tests.realtime_helpers import MODEL_NAME, Client, append_events, fixture_pcm, serving
from tests.test_minicpmo_native_session import MODEL as MINICPMO
from tests.test_minicpmo_native_session import decisions, silence_pcm, voice_url
from vllm_omni.client.native_duplex import native_opening
from vllm_omni.client.streaming import append_events as unit_appends
from vllm_omni.client.streaming import unit_boundary_ms
from vllm_omni.config import get_deploy_config_path, load_deploy_config, modify_stage_config
from vllm_omni.engine import OmniEngine
from vllm_omni.models.qwen3_omni.family import CodecChunker, Qwen3OmniFamily
from vllm_omni.session.base import NativeDuplexSettings

OUTPUT_RATE = 24000  # both models' PCM16 output
AUDIO_DELTA, TRANSCRIPT_DELTA = "response.output_audio.delta", "response.output_audio_transcript.delta"
DONE_BLOCK = ["response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
              "response.output_item.done"]  # then response.done


def codec_chunk_ends(frames: int) -> list[int]:
    """After which of the first `frames` codec frames the duplex deploy cuts a code2wav chunk: a
    talker that stops there leaves its last chunk empty, one that stops between two fills it."""
    deploy = load_deploy_config(get_deploy_config_path("qwen3_omni_tiny_cpu_duplex"), platform="cpu")
    chunker = CodecChunker(next(c.extra for c in deploy.connectors if c.extra is not None), streaming=True)
    return [n for n in range(1, frames + 1) if chunker.add((0,) * 16) is not None]


def talker_speaking(frames: int) -> dict[str, int]:
    """The talker speaks exactly `frames` frames (its last allowed code gets none): an answer is
    still generating when a client interrupts it after its first audio."""
    return {"stages.1.default_sampling_params.max_tokens": frames + 1,
            "stages.1.default_sampling_params.min_tokens": frames + 1}


@contextmanager
def duplex_deploy_engine(checkpoint, frames: int, folder: Path) -> Iterator[tuple[OmniEngine, str]]:
    """An engine of configs/qwen3_omni_tiny_cpu_duplex.yaml, and the deploy's session mode."""
    path = modify_stage_config(get_deploy_config_path("qwen3_omni_tiny_cpu_duplex"), talker_speaking(frames),
                               folder / "deploy.yaml")
    deploy = load_deploy_config(path, platform="cpu")
    engine = OmniEngine(Qwen3OmniFamily(checkpoint, deploy))
    try:
        yield engine, deploy.session_mode
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def engine(tiny_loaded, tmp_path_factory: pytest.TempPathFactory):
    assert 59 not in codec_chunk_ends(59)  # the last chunk holds frames: the engine marks it
    with duplex_deploy_engine(tiny_loaded, 59, tmp_path_factory.mktemp("interrupted")) as served:
        yield served


@pytest.fixture(scope="module")
def duplex_url(engine):
    """The duplex deploy as it is served: session_mode duplex."""
    torch_engine, session_mode = engine
    with serving(torch_engine, borrowed=True, session_mode=session_mode) as (url, _, _):
        yield url


@pytest.fixture(scope="module")
def turn_url(engine):
    """The same engine behind a turn-mode server: the GA lane."""
    with serving(engine[0], borrowed=True, session_mode="turn") as (url, _, _):
        yield url


@pytest.fixture(scope="module")
def vllm_duplex_url(vllm_engine):
    with serving(vllm_engine, borrowed=True, session_mode="duplex") as (url, _, _):
        yield url


@pytest.fixture(scope="module")
def native_url(minicpmo_vllm_engine):
    settings = NativeDuplexSettings(allow_test_decisions=True)
    with serving(minicpmo_vllm_engine, model_name=MINICPMO, session_mode="duplex", native_duplex=settings,
                 borrowed=True) as (url, _, _):
        yield url


# Reading the wire ------------------------------------------------------------------------------------

def audio_ms(events: list[dict[str, Any]]) -> int:
    """The audio the deltas carry, as the server counts it: floor(samples × 1000 / rate)."""
    samples = sum(len(base64.b64decode(e["delta"])) // 2 for e in events if e["type"] == AUDIO_DELTA)
    return samples * 1000 // OUTPUT_RATE


def sent_transcript(events: list[dict[str, Any]], response_id: str, kind: str = TRANSCRIPT_DELTA) -> str:
    return "".join(e["delta"] for e in events if e["type"] == kind and e["response_id"] == response_id)


def end_of_turn_flags(deltas: list[dict[str, Any]]) -> list[bool]:
    """Each audio delta's `end_of_turn` (in `vllm_omni`; also in `metadata` where a lane sends that)."""
    flags = []
    for delta in deltas:
        flag = delta["vllm_omni"]["end_of_turn"]
        assert delta.get("metadata", {}).get("end_of_turn", flag) == flag, delta.get("metadata")
        flags.append(flag)
    return flags


async def spoken_start(client: Client) -> list[dict[str, Any]]:
    """Events until the answer has sent both audio and text (it is still generating then)."""
    events: list[dict[str, Any]] = []
    while not (any(e["type"] == AUDIO_DELTA and e["delta"] for e in events)
               and any(e["type"] == TRANSCRIPT_DELTA and e["delta"] for e in events)):
        event = await client.next(120)
        assert event["type"] not in ("error", "response.done"), event
        events.append(event)
    return events


async def retrieved_transcript(client: Client, item_id: str) -> str:
    await client.send({"type": "conversation.item.retrieve", "item_id": item_id})
    return (await client.until("conversation.item.retrieved"))[-1]["item"]["content"][0]["transcript"]


def check_done_block(events: list[dict[str, Any]], response_id: str, reason: str) -> str:
    """The cancelled answer's done block finishes every part it started; returns the transcript
    its deltas sent, which the transcript's and the part's done carry."""
    assert [e for e in events if e["type"] == "error"] == []
    done = events[-1]
    assert done["type"] == "response.done" and done["response"]["id"] == response_id
    assert (done["response"]["status"], done["response"]["status_details"]["reason"]) == ("cancelled", reason)
    sent = sent_transcript(events, response_id)
    assert sent
    own = [e for e in events if e.get("response_id") == response_id]
    block = [e["type"] for e in own if e["type"] in DONE_BLOCK]
    assert block == DONE_BLOCK, block
    assert [e["transcript"] for e in own if e["type"] == "response.output_audio_transcript.done"] == [sent]
    assert [e["part"] for e in own if e["type"] == "response.content_part.done"] == [
        {"type": "audio", "transcript": sent}]
    return sent


# Interrupting a Qwen3-Omni answer on the duplex lane -------------------------------------------------

async def by_response_cancel(client: Client, _: str) -> None:
    await client.send({"type": "response.cancel"})


async def by_clear(client: Client, _: str) -> None:
    await client.send({"type": "output_audio_buffer.clear"})


async def by_input_cancel(client: Client, _: str) -> None:
    await client.send({"type": "input.cancel"})


async def by_speaking(client: Client, _: str) -> None:
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav", trailing_silence_s=0.6)))


INTERRUPTS: dict[str, tuple[Callable[[Client, str], Awaitable[None]], str]] = {
    "response.cancel": (by_response_cancel, "client_cancelled"),
    "output_audio_buffer.clear": (by_clear, "output_audio_buffer_clear"),
    "input.cancel": (by_input_cancel, "barge_in"),
    "server_vad_barge_in": (by_speaking, "turn_detected"),
}


async def interrupted_answer(url: str, kind: str) -> None:
    """A spoken question; once its answer has spoken and written something, the client acknowledges
    half of the first audio delta and interrupts: the done block carries the whole transcript sent,
    the conversation item the share of it the acknowledged audio speaks (docs/realtime-api.md §6.5)."""
    interrupt, reason = INTERRUPTS[kind]
    vad = kind == "server_vad_barge_in"
    client = await Client.open(f"{url}/v1/realtime?model={MODEL_NAME}")
    await client.until("session.updated")
    await client.send({"type": "session.update", "session": {
        "modalities": ["audio", "text"], "turn_detection": {"type": "server_vad"} if vad else None,
        "overlap_policy": "barge_in_on_speech" if vad else "listen_only"}})
    await client.until("session.updated")
    await client.send_all(append_events(fixture_pcm("speech_en_single.wav", trailing_silence_s=0.6 if vad else 0)))
    if not vad:
        await client.send({"type": "input_audio_buffer.commit"})
        await client.send({"type": "response.create"})
    events = await spoken_start(client)
    response_id = next(e for e in events if e["type"] == "response.created")["response"]["id"]
    committed_ms = max(1, audio_ms([next(e for e in events if e["type"] == AUDIO_DELTA)]) // 2)
    await client.send({"type": "playback.ack", "response_id": response_id, "played_ms": committed_ms})
    await interrupt(client, response_id)
    events += await client.until("response.done")
    sent = check_done_block(events, response_id, reason)
    total_ms = audio_ms([e for e in events if e.get("response_id") == response_id])
    kept = sent[: len(sent) * min(committed_ms, total_ms) // total_ms]
    assert len(kept) < len(sent)
    assert events[-1]["response"]["output"][0]["content"][0]["transcript"] == kept
    assert await retrieved_transcript(client, f"item_{response_id}") == kept
    await client.close()


@pytest.mark.parametrize("kind", list(INTERRUPTS))
async def test_an_interrupted_answer_finishes_its_transcript(duplex_url, kind: str) -> None:
    await interrupted_answer(duplex_url, kind)


async def test_an_interrupted_answer_finishes_its_transcript_on_vllm_stages(vllm_duplex_url) -> None:
    await interrupted_answer(vllm_duplex_url, "response.cancel")


async def test_a_cancelled_ga_answer_finishes_its_transcript_in_ga_events(turn_url) -> None:
    """A pure-GA client: the same block, and every event of the answer is a GA server event."""
    client = await Client.open(f"{turn_url}/v1/realtime", extensions=False)
    await client.send({"type": "session.update", "session": {"type": "realtime", "model": MODEL_NAME,
                                                             "output_modalities": ["audio"]}})
    await client.until("session.updated")
    await client.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}})
    await client.send({"type": "response.create"})
    events = await spoken_start(client)
    response_id = next(e for e in events if e["type"] == "response.created")["response"]["id"]
    await client.send({"type": "response.cancel"})
    events += await client.until("response.done")
    check_done_block(events, response_id, "client_cancelled")
    assert await retrieved_transcript(client, f"item_{response_id}") == ""  # nothing acknowledged as played
    answer = client.events[next(i for i, e in enumerate(client.events) if e["type"] == "response.created"):]
    assert [problem for e in answer for problem in ga_problems({k: v for k, v in e.items() if k != "_t"})] == []
    await client.close()


# A native MiniCPM-o barge-in -------------------------------------------------------------------------

async def test_a_native_barge_in_finishes_its_transcript(native_url) -> None:
    """The model speaks two units; the client acknowledges the first and barges in: the done block
    carries both units' text, the item the first unit's (its text–audio mark)."""
    opening = native_opening(model=MINICPMO, ref_audio=voice_url(),
                             duplex_test_decisions=["listen"] + ["speak"] * 6)
    client = await Client.open(f"{native_url}/v1/realtime?duplex=1")
    await client.send(opening)
    await client.until("session.updated")
    await client.send_all(unit_appends(silence_pcm(unit_boundary_ms(2)), chunk_ms=200))
    events = await decisions(client, 3)
    response_id = next(e for e in events if e["type"] == "response.created")["response"]["id"]
    first_mark = next(e for e in events if e["type"] == AUDIO_DELTA)["vllm_omni"]["audio_text_marks"][0]
    await client.send({"type": "playback.ack", "response_id": response_id, "played_ms": first_mark["audio_end_ms"]})
    await client.send({"type": "input.cancel"})
    events += await client.until("response.done")
    sent = check_done_block(events, response_id, "barge_in")
    assert await retrieved_transcript(client, f"item_{response_id}") == sent[: first_mark["text_chars"]]
    await client.close_session()


# end_of_turn on a completed Qwen3-Omni answer ---------------------------------------------------------

async def completed_answer(client: Client) -> list[dict[str, Any]]:
    await client.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there."}]}})
    await client.send({"type": "response.create"})
    events = await client.until("response.done")
    assert events[-1]["response"]["status"] == "completed" and "error" not in [e["type"] for e in events]
    return events


def check_end_of_turn(events: list[dict[str, Any]], last_has_audio: bool | None = True) -> None:
    """The last audio delta, and only it, ends the turn; every earlier one carries audio (the last
    one: as `last_has_audio` says, None: either)."""
    deltas = [e for e in events if e["type"] == AUDIO_DELTA]
    flags = end_of_turn_flags(deltas)
    assert len(flags) >= 2 and flags == [False] * (len(flags) - 1) + [True]
    assert all(e["delta"] for e in deltas[:-1])
    assert last_has_audio is None or bool(deltas[-1]["delta"]) == last_has_audio


async def duplex_answer(url: str) -> list[dict[str, Any]]:
    client = await Client.open(f"{url}/v1/realtime?model={MODEL_NAME}")
    await client.until("session.updated")
    await client.send({"type": "session.update", "session": {"turn_detection": None}})
    await client.until("session.updated")
    events = await completed_answer(client)
    await client.close()
    return events


@pytest.mark.parametrize("lane", ["duplex", "ga"])
async def test_the_last_audio_delta_of_an_answer_ends_the_turn(duplex_url, turn_url, lane: str) -> None:
    """The engine marks the chunk decoded from the talker's last frames as the last."""
    if lane == "duplex":
        check_end_of_turn(await duplex_answer(duplex_url))
        return
    client = await Client.open(f"{turn_url}/v1/realtime", extensions=True)  # GA with end_of_turn
    await client.send({"type": "session.update", "session": {"type": "realtime", "model": MODEL_NAME}})
    await client.until("session.updated")
    check_end_of_turn(await completed_answer(client))
    await client.close()


async def test_an_answer_whose_last_frame_ends_a_chunk_ends_the_turn_on_an_empty_delta(
        tiny_loaded, tmp_path: Path) -> None:
    """The talker stops right after a chunk was cut: the last chunk has no frames, so the engine
    could not know the one before was the last; an empty delta carries the mark instead."""
    frames = codec_chunk_ends(64)[-1]
    with duplex_deploy_engine(tiny_loaded, frames, tmp_path) as (engine, session_mode), \
            serving(engine, borrowed=True, session_mode=session_mode) as (url, _, _):
        check_end_of_turn(await duplex_answer(url), last_has_audio=False)


async def test_the_last_audio_delta_ends_the_turn_on_vllm_stages(vllm_duplex_url) -> None:
    check_end_of_turn(await duplex_answer(vllm_duplex_url), last_has_audio=None)
