"""The voice demo page: served from the package with nothing loaded from elsewhere, open
without the API key, and a real conversation in headless Chromium (Debian's package) whose
fake microphone plays a WAV: two server-VAD turns answered and played, transcripts and
timings shown, and a barge-in during the second answer that stops its playback and starts
the next turn, on the GA lane over WebRTC (the page's default, with the API key) and on the
duplex lane over its WebSocket; and push to talk from the keyboard over a WebSocket.
Screenshots go to test-artifacts/."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import wave
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO
from tests.realtime_helpers import fixture_pcm, running_server
from vllm_omni.server.demo_page import DEMO_DIR

KEY = "sk-demo"
ARTIFACTS = REPO / "test-artifacts"
RATE = 16000
# spoken answers of 60 to 80 codec frames (4.8 to 6.4 s): the first plays out before the next
# question, the second still plays when the third one starts
SHORT_ANSWERS = {"stages.1.default_sampling_params.max_tokens": 80, "stages.1.default_sampling_params.min_tokens": 60}
# headless as root, and quiet: this machine's closed network refuses Chromium's own connections
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--autoplay-policy=no-user-gesture-required", "--use-fake-ui-for-media-stream",
                  "--use-fake-device-for-media-stream", "--allow-loopback-in-peer-connection"]
INSTALL_CHROMIUM = (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"])


@pytest.fixture(scope="module")
def served(tiny_loaded):
    with running_server(tiny_loaded, SHORT_ANSWERS, api_key=KEY) as running:
        yield running


@pytest.fixture(scope="module")
def duplex_served(tiny_loaded):
    with running_server(tiny_loaded, {**SHORT_ANSWERS, "session_mode": "duplex"}, session_mode="duplex") as running:
        yield running


def test_the_page_and_its_assets_come_from_the_server_without_a_key(served) -> None:
    url, _, _ = served
    base = url.replace("ws://", "http://")
    page = httpx.get(base + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    sources = [*re.findall(r'(?:src|href)="([^"]+)"', page.text),
               *re.findall(r'addModule\("([^"]+)"\)', (DEMO_DIR / "demo.js").read_text())]
    served_here = sorted(source for source in sources if not source.startswith("data:"))  # inline: no request
    assert served_here == ["/demo/audio-worklets.js", "/demo/demo.css", "/demo/demo.js"]
    for source in served_here:
        assert httpx.get(base + source).status_code == 200, source
    for asset in DEMO_DIR.iterdir():  # nothing from the network: no absolute URLs anywhere
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", asset.read_text()), asset.name
    assert httpx.get(base + "/v1/models").status_code == 401  # the API stays behind the key


def chromium() -> str:
    """Debian's Chromium, installed on first use; the test is skipped only where it cannot be."""
    found = shutil.which("chromium")
    if found is None and shutil.which("apt-get"):
        for command in INSTALL_CHROMIUM:
            try:
                subprocess.run(command, capture_output=True, timeout=900, check=False)
            except (OSError, subprocess.TimeoutExpired):
                break
        found = shutil.which("chromium")
    if found is None:
        pytest.skip("Chromium is not installed and apt-get could not install it (package `chromium`)")
    return found


def microphone_wav(path: Path) -> Path:
    """What the fake microphone says: a question, a long pause (its answer plays out), a second
    question, and a third one 3 s after it, while the second answer plays; then silence."""
    two_turns = fixture_pcm("speech_en_two_turns.wav")
    single = fixture_pcm("speech_en_single.wav")

    def cut(pcm: bytes, start_ms: int, end_ms: int) -> bytes:
        return pcm[start_ms * RATE // 1000 * 2:end_ms * RATE // 1000 * 2]

    def silence(seconds: float) -> bytes:
        return b"\0\0" * int(RATE * seconds)

    audio = (silence(0.5) + cut(two_turns, 414, 2434) + silence(12.0) + cut(two_turns, 4158, 6274) + silence(3.0)
             + cut(single, 382, 3778) + silence(15.0))
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(audio)
    return path


@contextmanager
def demo_page(url: str, microphone: Path, *, key: str | None = None, duplex: bool = False, push_to_talk: bool = False,
              websocket: bool = False):
    """The demo page in headless Chromium, its fake microphone playing `microphone`, started
    (over WebRTC unless `websocket` or `duplex`)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    flags = [*CHROMIUM_FLAGS, f"--use-file-for-fake-audio-capture={microphone}%noloop"]
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=flags, headless=True)
        page = browser.new_page(viewport={"width": 390, "height": 1100})  # a phone-width screen
        page.goto(url.replace("ws://", "http://") + "/?echo_cancellation=0")
        if key is not None:
            page.get_by_label("API key").fill(key)
        if duplex:
            page.get_by_label("Duplex lane").check()
        if websocket:
            page.get_by_label("WebSocket", exact=True).check()
        if push_to_talk:
            page.get_by_label("Push to talk").check()
        page.get_by_role("button", name="Start").click()
        try:
            yield page
        finally:
            browser.close()


@pytest.mark.parametrize("lane", ["realtime", "duplex"])
def test_a_conversation_in_headless_chromium_with_a_barge_in(request, lane: str, tmp_path) -> None:
    """The GA lane over WebRTC with the API key, or the duplex lane (over its WebSocket) of a
    `session_mode: duplex` server."""
    url, _, _ = request.getfixturevalue("served" if lane == "realtime" else "duplex_served")
    with demo_page(url, microphone_wav(tmp_path / "mic.wav"), key=KEY if lane == "realtime" else None,
                   duplex=lane == "duplex") as page:
        stats = wait_for(page, "window.demoStats.turns.length >= 3 && window.demoStats.turns[2].end === 'completed' "
                               "&& [...document.querySelectorAll('#transcript li.user')]"
                               ".filter((li) => li.textContent !== '…').length >= 3", timeout_s=120)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"demo-{lane}.png"), full_page=True)
        users = page.locator("#transcript li.user").all_inner_texts()
        answers = page.locator("#transcript li.assistant").all_inner_texts()
        rows = page.locator("#timings tr").count()
    first, second, third = stats["turns"][:3]
    played = stats["playedByResponse"]
    assert not stats["errors"], stats["errors"]
    assert stats["transport"] == ("webrtc" if lane == "realtime" else "websocket")
    assert (first["end"], second["end"], third["end"]) == ("completed", "barge-in", "completed")
    assert stats["bargeIns"] == 1
    for turn in (first, second, third):
        assert turn["ttftMs"] > 0 and turn["ttfpMs"] > 0, turn  # TTFP as heard: on the call's track over WebRTC
    assert first["receivedSamples"] > 24000 and played[first["responseId"]] >= first["receivedSamples"] - 1
    if lane == "realtime":  # the server stopped its track and truncated the item to what it had played
        assert 0 < second["truncatedMs"] < 6400 and played[second["responseId"]] > 0, second
    else:
        assert 0 < played[second["responseId"]] < second["receivedSamples"]  # playback stopped mid-answer
    assert len(users) >= 3 and all(text.strip() not in ("", "…") for text in users)
    assert len(answers) >= 3 and answers[0].strip() and rows >= 3


def test_push_to_talk_from_the_keyboard(served, tmp_path) -> None:
    url, _, _ = served
    with demo_page(url, microphone_wav(tmp_path / "mic.wav"), key=KEY, push_to_talk=True, websocket=True) as page:
        wait_for(page, "window.demoStats.state.startsWith('ready')", timeout_s=30)
        page.get_by_role("button", name="Hold to talk").focus()
        page.keyboard.down(" ")  # held through the first question (0.5 s to 2.5 s of the recording)
        time.sleep(3.0)
        page.keyboard.up(" ")
        stats = wait_for(page, "window.demoStats.turns.length >= 1 && window.demoStats.turns[0].end === 'completed'",
                         timeout_s=60)
    (turn,) = stats["turns"]  # the rest of the recording was never sent: no other turn
    assert not stats["errors"] and turn["receivedSamples"] > 0 and turn["ttfpMs"] > 0


def wait_for(page, condition: str, timeout_s: float) -> dict:
    """The page's stats once `condition` holds (polled); fails with the stats it reached."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if page.evaluate(condition):
            return page.evaluate("window.demoStats")
        time.sleep(0.25)
    pytest.fail(f"the page did not get there in {timeout_s:.0f} s: {page.evaluate('window.demoStats')}")
