"""The bundled client on the duplex lane (docs/realtime-api.md §13) against a real server on the
tiny duplex deploy: the resumable connection, `vllm-omni client --duplex`, and
`vllm-omni bench realtime --duplex` with and without barge-in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import audio_fixture_path
from tests.realtime_helpers import MODEL_NAME, append_events, fixture_pcm, running_server
from vllm_omni.cli.main import main
from vllm_omni.client.duplex import DuplexConnection
from vllm_omni.client.url import realtime_url

QUESTION = str(audio_fixture_path("speech_en_single.wav"))


@pytest.fixture(scope="module")
def server_url(tiny_loaded):
    overrides = {"stages.1.default_sampling_params.max_tokens": 48}
    with running_server(tiny_loaded, overrides, session_mode="duplex") as (url, _, _):
        yield url.replace("ws://", "http://")


async def test_a_dropped_socket_resumes_and_every_event_arrives_once(server_url: str) -> None:
    conn = await DuplexConnection.start(realtime_url(server_url, model=MODEL_NAME), ack_every=4)  # autostart
    assert conn.session_id.startswith("duplex-") and conn.attachment_generation == 1
    first_token = conn.resume_token
    await conn.send_all(append_events(fixture_pcm("speech_en_single.wav")))
    await conn.commit()
    await conn.send({"type": "response.create"})
    await conn.until("response.output_audio.delta")
    conn.ws.transport.abort()  # the network went away mid-answer
    resumed = await conn.resume()
    assert resumed["attachment_generation"] == conn.attachment_generation == 2
    assert conn.resume_token == resumed["resume_token"] != first_token
    done = (await conn.until("response.done"))[-1]
    assert done["response"]["status"] == "completed"
    seqs = [e["server_event_seq"] for e in conn.events if "server_event_seq" in e]
    assert seqs == list(range(1, len(seqs) + 1))  # every event once, none missing
    assert conn.acked_seq > 0 and "error" not in [e["type"] for e in conn.events]
    await conn.close_session()


def test_client_cli_on_the_duplex_lane(server_url: str, tmp_path: Path, capsys) -> None:
    image = tmp_path / "red.png"
    Image.new("RGB", (32, 32), (200, 0, 0)).save(image)
    code = main(["client", "--duplex", "--url", server_url, "--wav", QUESTION, "--out", str(tmp_path / "a.wav"),
                 "--fast", "--image", str(image)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "turn 1:" in out and "TTFT ms" in out and "TTFP ms" in out and "RTF" in out
    assert "server error" not in err  # an image refusal (§4.5) is reported on its own, and the turn goes on


def test_bench_on_the_duplex_lane_with_barge_in(server_url: str, tmp_path: Path, capsys) -> None:
    common = ["bench", "realtime", "--url", server_url, "--turns", "1", "--no-baseline"]
    assert main([*common, "--duplex", "--sessions", "2", "--wav", QUESTION, "--out-dir", str(tmp_path / "plain")]) == 0
    row = json.loads((tmp_path / "plain" / "results.json").read_text())["results"]["vllm-omni"][0]
    assert row["completed_turns"] == row["turns"] == row["responses"] == 2 and row["error_events"] == 0
    assert row["ttfp_ms"]["count"] == 2 and row["ttfp_ms"]["p95"] is not None
    assert row["barge_in_reaction_ms"]["count"] == 0

    # A question whose answer (greedy, tiny model) lasts long enough to be spoken over.
    question = str(audio_fixture_path("speech_with_pause.wav"))
    assert main([*common, "--barge-in", "--sessions", "1", "--wav", question, "--barge-in-wav", QUESTION,
                 "--out-dir", str(tmp_path / "barge")]) == 0
    printed = capsys.readouterr().out
    row = json.loads((tmp_path / "barge" / "results.json").read_text())["results"]["vllm-omni"][0]
    assert row["responses"] == 2 and row["cancelled_responses"] == 1 and row["error_events"] == 0
    reaction = row["barge_in_reaction_ms"]
    assert reaction["count"] == 1 and reaction["p50"] is not None and reaction["p95"] is not None
    assert "barge p50" in printed
