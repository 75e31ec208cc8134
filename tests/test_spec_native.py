"""A natively duplex session recorded whole and checked against the wire contract
(docs/realtime-api.md §13.7, docs/conformance.md §5.5 and §6): every response is R(r), every
commit C(X), one response at a time, the duplex [EXT] fields on listen / speak / overlap events,
and session.closed as the last event. Written from the spec, run against every native deploy:
MiniCPM-o (torch and vLLM, 1 s units) and Moshi (80 ms frames), each on its own unit grid."""

from __future__ import annotations

import asyncio
import base64
import io
from dataclasses import dataclass

import pytest
from PIL import Image

from tests.realtime_helpers import Client, fixture_pcm, serving
from tests.spec_sequences import check_native_units, check_recording
from vllm_omni.client.native_duplex import UNIT_EVENTS
from vllm_omni.client.streaming import UnitGrid, append_events
from vllm_omni.config import load_deploy_config
from vllm_omni.models.registry import load_engine
from vllm_omni.session.base import NativeDuplexSettings

MODEL = "native-tiny"
MINICPMO_GRID, MOSHI_GRID = UnitGrid(1030, 1000), UnitGrid(80, 80)


@dataclass(frozen=True)
class Deploy:
    url: str
    grid: UnitGrid  # the unit grid its sessions must announce


@pytest.fixture(scope="module", params=["minicpmo-torch", "minicpmo-vllm", "moshi"])
def server(request):
    """The tiny MiniCPM-o on configs/minicpmo_4_5_tiny_cpu_torch.yaml, or the shared vLLM deploy
    (configs/minicpmo_4_5_tiny_cpu.yaml: run under the heavy-run lock), or the shared tiny Moshi
    (configs/moshi_tiny_cpu.yaml)."""
    grid = MOSHI_GRID if request.param == "moshi" else MINICPMO_GRID
    settings = NativeDuplexSettings(allow_test_decisions=True, continuation_limit_units=3,
                                    continuation_period_ms=0.3 * grid.period_ms)
    if request.param == "minicpmo-torch":
        config = load_deploy_config("configs/minicpmo_4_5_tiny_cpu_torch.yaml")
        engine, borrowed = load_engine(request.getfixturevalue("minicpmo_checkpoint"), config), False
    else:
        engine = request.getfixturevalue("moshi_engine" if request.param == "moshi" else "minicpmo_vllm_engine")
        borrowed = True
    with serving(engine, model_name=MODEL, session_mode="duplex", native_duplex=settings,
                 borrowed=borrowed) as (url, _, _):
        yield Deploy(url, grid)


def silence(ms: int) -> bytes:
    return b"\0\0" * (16 * ms)


async def opened(server: Deploy, overlap_policy: str = "listen_only", turn_detection: dict | None = None,
                 **extra_body) -> tuple[Client, dict]:
    client = await Client.open(f"{server.url}/v1/realtime?duplex=1")
    await client.send({"type": "session.update", "session": {
        "model": MODEL, "modalities": ["text"], "turn_detection": turn_detection, "input_audio_format": "pcm16",
        "overlap_policy": overlap_policy, "extra_body": {"auto_response": True, **extra_body}}})
    created, updated = await client.next(), await client.next()
    assert (created["type"], updated["type"]) == ("session.created", "session.updated")
    assert UnitGrid.of(updated["session"]["capabilities"]) == server.grid
    return client, created


async def decided(client: Client, count: int) -> list[dict]:
    seen, units = [], 0
    while units < count:
        seen.append(await client.next())
        assert seen[-1]["type"] != "error", seen[-1]
        units += seen[-1]["type"] in UNIT_EVENTS
    return seen


async def closed(client: Client) -> dict:
    await client.send({"type": "session.close"})
    events = await client.until("session.closed", timeout=30)
    await asyncio.wait_for(client.ws.wait_closed(), 10)
    assert client.ws.close_code == 1000
    await client.close()
    return events[-1]


def test_a_native_session_obeys_the_unit_and_response_orderings(server) -> None:
    """§5.5: listen, speak (R(r) with response.speak before its first delta), a second model turn,
    a commit{final, create_response} (C(X) and the residual unit, §6.6: the model decides), then
    close: every response R(r), one at a time,
    each listen {session_id, epoch, response{object, status:listening, metadata.reason}}."""
    async def scenario():
        script = ["listen", "speak", "speak_end", "listen", "speak", "speak_end", "listen"]
        client, created = await opened(server, duplex_test_decisions=script)
        session_id = created["session"]["id"]
        grid = server.grid
        speech = fixture_pcm("speech_en_long.wav")[: 32 * (grid.boundary_ms(5) + grid.period_ms * 3 // 10)]
        await client.send_all(append_events(speech, chunk_ms=200))  # 6 units, then a spoken residual
        events = await decided(client, 6)
        # create_response has no effect in an auto session: the model's scripted listen decides
        await client.send({"type": "input_audio_buffer.commit", "final": True, "create_response": True})
        events += await decided(client, 1)
        await client.send({"type": "session.heartbeat"})
        events += await client.until("session.heartbeat_ack")
        end = await closed(client)
        assert (end["type"], end["session_id"], end["reason"]) == ("session.closed", session_id, "client_close")
        assert client.events[-1] is end  # the last event of the session
        check_recording(client.events[2:-1], lane="N")
        check_native_units(client.events)
        listens = [e for e in events if e["type"] == "response.listen"]
        assert len(listens) == 3
        for listen in listens:
            shape = (listen["session_id"], listen["response"]["object"], listen["response"]["status"],
                     listen["response"]["metadata"]["reason"], listen["response"]["metadata"]["model_listen"])
            assert shape == (session_id, "realtime.response", "listening", "model_listen", True), listen
            assert isinstance(listen["epoch"], int) and "response_id" not in listen, listen
        speaks = [e for e in events if e["type"] == "response.speak"]
        assert len(speaks) == 2 and all(
            e["item_id"] == f"item_{e['response_id']}" and (e["output_index"], e["content_index"]) == (0, 0)
            and e["metadata"]["session_id"] == session_id and e["metadata"]["model_speak"] is True for e in speaks)
        done = [e["response"]["status"] for e in events if e["type"] == "response.done"]
        assert done == ["completed", "completed"]
        assert [e["type"] for e in events].count("input_audio_buffer.committed") == 1
        numbered = [e["server_event_seq"] for e in client.events[1:-1]]
        assert numbered == list(range(numbered[0], numbered[0] + len(numbered)))

    asyncio.run(scenario())


def test_a_barge_in_ends_the_response_with_its_done_block(server) -> None:
    """§5.3.1 / §6.7 rule 2 on the native lane: overlap_action barge_in → overlap.decision
    {session_id, epoch, policy, action, reason, metadata}, then the cancelled R(r) tail."""
    async def scenario():
        client, created = await opened(server, duplex_test_decisions=["speak"] * 8)
        appends = append_events(silence(server.grid.boundary_ms(3)), chunk_ms=200)
        boundary = next(i for i in range(len(appends)) if (i + 1) * 200 >= server.grid.boundary_ms(1))
        await client.send_all(appends[: boundary + 1])
        await decided(client, 2)
        await client.send({**appends[boundary + 1], "overlap_action": "barge_in"})
        tail = await client.until("response.done")
        decision = next(e for e in tail if e["type"] == "overlap.decision")
        assert (decision["session_id"], decision["action"], decision["reason"]) == (
            created["session"]["id"], "barge_in", "client_overlap_action")
        assert isinstance(decision["epoch"], int) and isinstance(decision["metadata"], dict) and decision["policy"]
        assert tail[-1]["response"]["status"] == "cancelled"
        assert tail[-1]["response"]["status_details"]["reason"] == "barge_in"
        await client.send({"type": "session.heartbeat"})
        await client.until("session.heartbeat_ack")
        await closed(client)
        check_recording(client.events[2:-1], lane="N")
        check_native_units(client.events)

    asyncio.run(scenario())


def test_speech_over_an_answer_barges_in_under_barge_in_on_speech(server) -> None:
    """§6.7 rule 4 (auto session, model with barge-in, policy barge_in_on_speech): a speech append
    while the model speaks → overlap.decision barge_in, the response cancelled; rule 4' otherwise
    (silence keeps streaming: listen auto_response_continuous)."""
    async def scenario():
        client, _ = await opened(server, "barge_in_on_speech", {"type": "server_vad"},
                                 duplex_test_decisions=["speak"] * 8)
        await client.send_all(append_events(silence(server.grid.boundary_ms(0)), chunk_ms=200))
        await decided(client, 1)
        await client.send(append_events(silence(200), chunk_ms=200)[0])
        speech = append_events(fixture_pcm("speech_en_single.wav")[32 * 1000: 32 * 1400], chunk_ms=200)
        await client.send_all(speech)
        events = await client.until("response.done")
        decisions = [(e["action"], e["reason"]) for e in events if e["type"] == "overlap.decision"]
        assert decisions[0] == ("listen", "auto_response_continuous")
        assert decisions[1][0] == "barge_in" and decisions[1][1] in (
            "barge_in_on_speech", "server_vad_speech_started", "policy_barge_in_on_speech")
        assert events[-1]["response"]["status"] == "cancelled"
        await closed(client)

    asyncio.run(scenario())


def png(color: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> str:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


def test_stacked_frame_pairs_and_queued_groups_are_taken(server) -> None:
    """§6.3: a `[base, composite]` pair rides one append; two groups on appends before unit 0
    closes bind to units 0 and 1 (the second queues); `null` entries are skipped; every unit is
    decided and nothing is refused."""
    async def scenario():
        client, _ = await opened(server, duplex_test_decisions=["listen"] * 3)
        appends = append_events(silence(server.grid.boundary_ms(2)), chunk_ms=200)
        appends[0]["video_frames"] = [png((200, 20, 20)), png((20, 200, 20), (128, 48))]
        appends[1]["video_frames"] = [png((20, 20, 200)), None]
        await client.send_all(appends)
        events = await decided(client, 3)
        assert [e["type"] for e in events] == ["response.listen"] * 3
        await closed(client)

    asyncio.run(scenario())
