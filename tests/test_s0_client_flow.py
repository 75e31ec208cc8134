"""The seed client's whole flow through the real server (tests/s0_client.py; docs/realtime-api.md §13,
§12): natively duplex MiniCPM-o and Moshi sessions (configs/minicpmo_4_5_tiny_cpu.yaml,
configs/moshi_tiny_cpu.yaml) and a turn-based
Qwen3-Omni duplex session (configs/qwen3_omni_tiny_cpu_duplex.yaml, and its stages on vLLM), each
opened with the flat `session.update`, fed real speech in 200 ms appends paced in real time, committed,
acknowledged and closed. The client's timing summary must come out complete from the fields where
the seed client reads them, and the trace must keep the duplex lane's invariants."""

from __future__ import annotations

import base64
import io
import math
from collections import Counter
from typing import Any

import pytest
from PIL import Image

from tests.realtime_helpers import MODEL_NAME, fixture_pcm, serving
from tests.s0_client import TEXT_DELTAS, EventCollector, S0Client, S0Options, missing_fields, timing_summary
from tests.test_minicpmo_native_session import voice_url
from vllm_omni.config import get_deploy_config_path, load_deploy_config
from vllm_omni.engine import OmniEngine
from vllm_omni.models.qwen3_omni.family import Qwen3OmniFamily
from vllm_omni.session.base import NativeDuplexSettings

MINICPMO, MOSHI = "minicpmo-tiny", "moshi-tiny"
CONTINUATION_LIMIT = 3  # silence units after the clip (the deploy's 64 would take a minute per session)
TIMEOUT_S = 240.0  # generous: vLLM stages on a loaded 2-core box
UNSEQUENCED = {"session.created"}  # docs/realtime-api.md §13.4: everything else the session sends is journaled


@pytest.fixture(scope="module")
def minicpmo_url(minicpmo_vllm_engine):
    """The shared engine of configs/minicpmo_4_5_tiny_cpu.yaml (tests/conftest.py), served with that deploy's
    session settings."""
    deploy = load_deploy_config("configs/minicpmo_4_5_tiny_cpu.yaml")
    defaults = deploy.session_defaults
    native = NativeDuplexSettings(continuation_limit_units=CONTINUATION_LIMIT,
                                  continuation_period_ms=defaults.continuation_period_ms)
    with serving(minicpmo_vllm_engine, model_name=MINICPMO, session_mode=deploy.session_mode, native_duplex=native,
                 max_sessions=defaults.max_sessions, borrowed=True) as (url, _, _):
        yield url.replace("ws://", "http://")


@pytest.fixture(scope="module")
def moshi_url(moshi_engine):
    """The shared engine of configs/moshi_tiny_cpu.yaml, served with that deploy's session settings."""
    defaults = load_deploy_config("configs/moshi_tiny_cpu.yaml").session_defaults
    native = NativeDuplexSettings(continuation_limit_units=CONTINUATION_LIMIT,
                                  continuation_period_ms=defaults.continuation_period_ms)
    with serving(moshi_engine, model_name=MOSHI, session_mode="duplex", native_duplex=native,
                 max_sessions=defaults.max_sessions, borrowed=True) as (url, _, _):
        yield url.replace("ws://", "http://")


@pytest.fixture(scope="module")
def duplex_deploy():
    return load_deploy_config(get_deploy_config_path("qwen3_omni_tiny_cpu_duplex"), platform="cpu")


@pytest.fixture(scope="module")
def qwen_torch_url(tiny_loaded, duplex_deploy):
    engine = OmniEngine(Qwen3OmniFamily(tiny_loaded, duplex_deploy))
    with serving(engine, session_mode=duplex_deploy.session_mode) as (url, _, _):
        yield url.replace("ws://", "http://")


@pytest.fixture(scope="module")
def qwen_vllm_url(vllm_engine, duplex_deploy):
    """The shared vLLM stages (tests/conftest.py) served in the duplex deploy's session mode."""
    with serving(vllm_engine, borrowed=True, session_mode=duplex_deploy.session_mode) as (url, _, _):
        yield url.replace("ws://", "http://")


def still_frame() -> str:
    """A bare base64 JPEG: the still image S0 sends with every unit."""
    out = io.BytesIO()
    Image.new("RGB", (64, 64), (40, 120, 200)).save(out, "JPEG")
    return base64.b64encode(out.getvalue()).decode()


async def run_s0(base: str, options: S0Options, pcm: bytes, frames: list[str] | None = None) -> S0Client:
    """S0's session: open, stream the clip, commit it (a commit-driven session then asks for the answer,
    docs/realtime-api.md §6.1), wait for the answers, acknowledge their playback, close."""
    client = await S0Client.connect(base, options.model)
    try:
        await client.configure(options)
        await client.stream_pcm16(pcm, frames)
        await client.commit()
        if not options.auto_response:
            await client.send({"type": "response.create"})
        await client.settle(responses=1, timeout=TIMEOUT_S)
        await client.acknowledge_playback(TIMEOUT_S)
        await client.close_session(TIMEOUT_S)
    except BaseException:
        await client.abort()
        raise
    return client


def sequence_problems(events: list[dict[str, Any]]) -> list[str]:
    """server_event_seq on every journaled event, 1, 2, 3, … through session.closed (§13.4)."""
    problems = [f"{e['type']} has no server_event_seq" for e in events
                if e["type"] not in UNSEQUENCED and not isinstance(e.get("server_event_seq"), int)]
    seqs = [e["server_event_seq"] for e in events if isinstance(e.get("server_event_seq"), int)]
    if seqs != list(range(1, len(seqs) + 1)):
        problems.append(f"server_event_seq not 1, 2, 3, ...: {seqs}")
    problems += [f"{e['type']} has no event_id" for e in events if not e.get("event_id")]
    return problems


def response_problems(events: list[dict[str, Any]], native: bool) -> list[str]:
    """One active response at a time, each ended once and followed by rate_limits.updated; speak at
    most once and before the first audio; a listen naming a response ends it; addressing; native:
    each audio delta immediately followed by one transcript delta (docs/realtime-api.md §6.0, §13.7)."""
    problems: list[str] = []
    active: str | None = None
    ended: set[str] = set()
    spoke: Counter[str] = Counter()
    audio_seen: set[str] = set()
    for index, event in enumerate(events):
        kind, rid = event["type"], event.get("response_id") or (event.get("response") or {}).get("id")
        if kind == "response.created":
            if active is not None:
                problems.append(f"{rid} created while {active} was active")
            active = rid
        elif kind == "response.done":
            if rid in ended:
                problems.append(f"second response.done for {rid}")
            ended.add(rid)
            active = None if active == rid else active
            following = events[index + 1]["type"] if index + 1 < len(events) else None
            if following != "rate_limits.updated":
                problems.append(f"response.done of {rid} followed by {following}, not rate_limits.updated")
        elif kind == "response.speak":
            spoke[rid] += 1
            if rid in audio_seen or spoke[rid] > 1:
                problems.append(f"response.speak of {rid} repeated or after its audio")
        elif kind == "response.output_audio.delta":
            audio_seen.add(rid)
            following = events[index + 1] if index + 1 < len(events) else {}
            if native and (following.get("type"), following.get("response_id")) != (
                    "response.output_audio_transcript.delta", rid):
                problems.append(f"audio delta of {rid} followed by {following.get('type')}")
        elif kind == "response.listen" and event.get("response_id") and not any(
                e["type"] == "response.done" and e["response"]["id"] == rid for e in events[index:]):
            problems.append(f"response.listen names {rid}, and no response.done for it follows")
        if rid in ended and kind.startswith("response.") and kind not in ("response.done", "response.listen"):
            problems.append(f"{kind} of {rid} after its response.done")
        if kind.startswith("response.") and "item_id" in event and event["item_id"] != f"item_{rid}":
            problems.append(f"{kind} of {rid} addresses {event['item_id']}")
        if "output_index" in event and event["output_index"] != 0:
            problems.append(f"{kind} has output_index {event['output_index']}")
    created = {e["response"]["id"] for e in events if e["type"] == "response.created"}
    problems += [f"{rid} never ended" for rid in created - ended]
    return problems


def audio_problems(collector: EventCollector) -> list[str]:
    """Each audio delta states its rate, format and cumulative duration where S0 reads them, the
    rate constant within a response; each started transcript and audio part gets its done (§5.4)."""
    problems: list[str] = []
    for record in collector.responses.values():
        rid = record.response_id
        if None in record.sample_rates:
            problems.append(f"{rid}: audio delta without top-level sample_rate_hz")
        if len(set(record.sample_rates)) > 1:
            problems.append(f"{rid}: sample_rate_hz changes within the response: {set(record.sample_rates)}")
        if any(f != "pcm16" for f in record.formats):
            problems.append(f"{rid}: audio delta format {set(record.formats)}, not pcm16")
        durations = record.durations_ms
        if None in durations:
            problems.append(f"{rid}: audio delta without metadata.audio_duration_ms")
        elif durations and (durations != sorted(durations) or durations[-1] != math.floor(
                record.audio_bytes // 2 * 1000 / record.sample_rate)):
            problems.append(f"{rid}: metadata.audio_duration_ms {durations} is not the cumulative "
                            f"duration of {record.audio_bytes} bytes")
        events = [e for e in collector.events if (e.get("response_id") or (e.get("response") or {}).get("id")) == rid]
        kinds = [e["type"] for e in events]
        if record.audio_times and kinds.count("response.output_audio.done") != 1:
            problems.append(f"{rid}: {kinds.count('response.output_audio.done')} response.output_audio.done")
        spoken = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
        dones = [e for e in events if e["type"] == "response.output_audio_transcript.done"]
        if spoken and [e["transcript"] for e in dones] != [spoken]:
            problems.append(f"{rid}: transcript deltas {spoken!r}, transcript.done {[e['transcript'] for e in dones]}")
        if record.status != "completed":
            problems.append(f"{rid}: status {record.status}")
    return problems


def session_problems(client: S0Client) -> list[str]:
    """Errors, the handshake, the acks and the close as S0 sees them."""
    events, collector = client.collector.events, client.collector
    problems = [f"server error: {e.get('error')}" for e in events if e["type"] == "error"]
    if [e["type"] for e in events[:2]] != ["session.created", "session.updated"]:
        problems.append(f"the session opened with {[e['type'] for e in events[:2]]}")
    acks = [e for e in client.sent if e["type"] == "playback.ack"]
    acked = [e["event"] for e in collector.of_type("playback.acknowledged")]
    if [(a["item_id"], a["played_ms"]) for a in acks] != [(e.get("item_id"), e.get("played_ms")) for e in acked]:
        problems.append(f"acks {acks} answered by {acked}")
    last = events[-1]
    if (last["type"], last.get("reason")) != ("session.closed", "client_close"):
        problems.append(f"last event {last['type']} ({last.get('reason')}), not session.closed (client_close)")
    if (client.ws.close_code, client.ws.close_reason) != (1000, "client_close"):
        problems.append(f"socket closed {client.ws.close_code} {client.ws.close_reason!r}")
    return problems


def check_s0_run(client: S0Client, native: bool) -> dict[str, Any]:
    collector = client.collector
    summary = timing_summary(collector)
    problems = session_problems(client) + sequence_problems(collector.events)
    problems += response_problems(collector.events, native) + audio_problems(collector)
    if summary["audio_turn_count"] < 1:
        problems.append("no response produced audio")
    problems += [f"timing summary: {name} missing" for name in missing_fields(summary)]
    assert not problems, "\n".join(problems)
    return summary


async def test_s0_flow_on_a_native_minicpmo_session(minicpmo_url) -> None:
    """S0's defaults (auto_response, no VAD, ack_only, a voice, frames on the units' appends): the
    model speaks over the clip and on, the final commit decides the padded residual, the silence
    units end the answer; every unit's audio comes with its rate and duration."""
    options = S0Options(model=MINICPMO, auto_response=True, ref_audio=voice_url())
    client = await run_s0(minicpmo_url, options, fixture_pcm("speech_en_single.wav"), frames=[still_frame()])
    framed = [e for e in client.sent if "video_frames" in e]
    assert [e["audio_end_ms"] for e in framed] == [1200, 2200, 3200, 4200, 5082]  # units 0-4 close on these
    summary = check_s0_run(client, native=True)
    assert any(e["type"] in TEXT_DELTAS and e.get("delta") for e in client.collector.events)
    print(f"\nS0 timing (native MiniCPM-o): {summary}")


async def test_s0_flow_on_a_native_moshi_session(moshi_url) -> None:
    """The same client on Moshi (80 ms frames, its own voice: no ref_audio, no frames): the model
    speaks through the clip and on, the commit's padded residual is its last frame of input, the
    silence frames end the answer."""
    client = await run_s0(moshi_url, S0Options(model=MOSHI, auto_response=True), fixture_pcm("speech_en_single.wav"))
    summary = check_s0_run(client, native=True)
    assert client.collector.chunk_period_ms == 80
    print(f"\nS0 timing (native Moshi): {summary}")


@pytest.mark.parametrize("stages", ["torch", "vllm"])
async def test_s0_flow_on_a_turn_based_duplex_session(stages: str, request: pytest.FixtureRequest) -> None:
    """The same client on Qwen3-Omni's duplex deploy: a commit-driven session (auto_response off,
    no voice, no frames: the model takes neither), answered after the commit."""
    url = request.getfixturevalue(f"qwen_{stages}_url")
    options = S0Options(model=MODEL_NAME, auto_response=False)
    client = await run_s0(url, options, fixture_pcm("speech_en_single.wav"))
    summary = check_s0_run(client, native=False)
    assert [t["t0_source"] for t in summary["responses"]] == ["commit"]
    print(f"\nS0 timing (Qwen3-Omni duplex, {stages}): {summary}")
