"""A second natively duplex family, registered here as a new family would be (its folder,
tests/stub_unit_family/, plus one registry entry), with 80 ms units instead of MiniCPM-o's
1000 ms, driven end to end by a real duplex session over a real socket: the session announces
the model's unit period, each unit is decided as its audio arrives however the appends were
chunked, the model's turn is a response (response.speak, audio and transcript deltas, done),
a cancel closes the model's turn (it listens again), and the session closes."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest

from tests.realtime_helpers import Client, serving
from tests.stub_unit_family.model import ANSWER_UNITS, SPEECH_UNITS, UNIT_MS, answer_audio, answer_word
from vllm_omni.audio.pcm import MODEL_RATE, float_to_pcm16_bytes, wav_bytes
from vllm_omni.client.streaming import append_events
from vllm_omni.config import DeployConfig
from vllm_omni.engine.interface import UnitEngine
from vllm_omni.models import registry
from vllm_omni.session.base import NativeDuplexSettings

MODEL = "stub-units"
ENTRY = registry.FamilyEntry("stub_units", ("StubUnitModel",), ("stub_units",),
                             "tests.stub_unit_family.model:StubUnitModel", units=True)
DEPLOY = DeployConfig(session_mode="duplex", stages=[{"stage_id": 0, "role": "thinker", "backend": "torch"}])
CONTINUATION_MS = 200


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = tmp_path_factory.mktemp("stub-units")
    (checkpoint / "config.json").write_text(json.dumps({"architectures": ["StubUnitModel"]}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "FAMILIES", (*registry.FAMILIES, ENTRY))
        engine = registry.load_engine(checkpoint, DEPLOY)
    assert isinstance(engine, UnitEngine) and not hasattr(engine, "generate")
    settings = NativeDuplexSettings(continuation_limit_units=8, continuation_period_ms=CONTINUATION_MS)
    with serving(engine, model_name=MODEL, session_mode="duplex", native_duplex=settings) as (url, _, _):
        yield url


def tone(ms: int, amplitude: float) -> bytes:
    t = np.arange(MODEL_RATE * ms // 1000) / MODEL_RATE
    return float_to_pcm16_bytes(amplitude * np.sin(2 * np.pi * 220 * t))


def voice_prompt() -> str:
    return "data:audio/wav;base64," + base64.b64encode(wav_bytes(tone(500, 0.3), MODEL_RATE)).decode()


async def opened(url: str) -> tuple[Client, dict]:
    client = await Client.open(f"{url}/v1/realtime?duplex=1")
    await client.send({"type": "session.update", "session": {
        "model": MODEL, "modalities": ["text", "audio"], "turn_detection": None, "ref_audio": voice_prompt(),
        "extra_body": {"auto_response": True}}})
    created, updated = await client.next(), await client.next()
    assert (created["type"], updated["type"]) == ("session.created", "session.updated"), (created, updated)
    return client, updated["session"]


def no_errors(events: list[dict]) -> list[dict]:
    assert not [e for e in events if e["type"] == "error"], [e for e in events if e["type"] == "error"]
    return events


async def test_an_80_ms_unit_model_answers_a_turn_unit_by_unit(server) -> None:
    client, session = await opened(server)
    capabilities = session["capabilities"]
    assert (capabilities["implementation_level"], capabilities["chunk_period_ms"]) == ("model_native_duplex", UNIT_MS)
    # 4 loud units then 6 quiet ones, in 30 ms appends: units never line up with the appends
    speech = tone(SPEECH_UNITS * UNIT_MS + UNIT_MS, 0.3) + tone(6 * UNIT_MS, 0.0)
    await client.send_all(append_events(speech, chunk_ms=30))
    events = no_errors(await client.until("response.done", timeout=30))
    listens = [e for e in events if e["type"] == "response.listen"]
    assert len(listens) == SPEECH_UNITS + 1 and all(e["response"]["metadata"]["reason"] == "model_listen"
                                                    for e in listens)
    speak = next(e for e in events if e["type"] == "response.speak")
    deltas = [e for e in events if e["type"] == "response.output_audio.delta"]
    audio = b"".join(base64.b64decode(e["delta"]) for e in deltas)
    assert audio == b"".join(answer_audio(i) for i in range(ANSWER_UNITS))
    transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert transcript == "".join(answer_word(i) for i in range(ANSWER_UNITS))
    done = events[-1]["response"]
    assert (done["id"], done["status"]) == (speak["response_id"], "completed")
    assert all(d["sample_rate_hz"] == 24000 for d in deltas)
    await client.close_session()


async def test_a_cancel_closes_the_model_turn_and_it_listens_again(server) -> None:
    client, _ = await opened(server)
    # the model begins its turn on the quiet unit; no input follows, so silence units (one per
    # continuation period) carry it on until the cancel
    await client.send_all(append_events(tone((SPEECH_UNITS + 1) * UNIT_MS, 0.3) + tone(UNIT_MS, 0.0), chunk_ms=40))
    events = no_errors(await client.until("response.speak", timeout=30))
    await client.send({"type": "response.cancel"})
    events = no_errors(await client.until("response.done", timeout=30))
    assert events[-1]["response"]["status"] == "cancelled"
    await client.send_all(append_events(tone(UNIT_MS, 0.0), chunk_ms=40))  # the next unit listens: the turn closed
    listen = no_errors(await client.until("response.listen", timeout=30))[-1]
    assert listen["response"]["metadata"]["reason"] == "model_listen"
    await asyncio.sleep(3 * CONTINUATION_MS / 1000)  # no silence units feed a cancelled turn
    await client.close_session()
    assert not [e for e in client.events if e["type"] in ("response.speak", "error")][1:]
