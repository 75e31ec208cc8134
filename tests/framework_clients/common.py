"""What every driver shares: the steps, the prompts and the tool, fixture audio, error capture, outcomes."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tests.framework_clients.proxy import RecordingProxy

DATA = Path(__file__).resolve().parents[1] / "data"

STEPS = ("audio_turns", "text_turn", "greet_first", "tool_call")
STEP_TIMEOUT_S = {"audio_turns": 240.0, "text_turn": 120.0, "greet_first": 120.0, "tool_call": 180.0}

FIRST_EVENT_TIMEOUT_S = 45.0  # from the end of a request (or its audio) to response.created
INSTRUCTIONS = "You are a helpful voice assistant. Keep every answer to one short sentence."
GREETING_INSTRUCTIONS = "Greet the user warmly in one short sentence."
TEXT_PROMPT = "Hello! Tell me one fun fact about the ocean."
TOOL_PROMPT = "What is the weather like in Paris today?"
AUDIO_FIXTURES = ("speech_en_single.wav", "speech_with_pause.wav")  # one spoken turn each
TRAILING_SILENCE_S = 1.5  # lets server-side VAD close each turn

WEATHER_PARAMETERS = {
    "type": "object",
    # an enum keeps a forced call short on the tiny random checkpoint (it spells JSON a byte a token)
    "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Tokyo"], "description": "The city"}},
    "required": ["city"],
}
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city.",
                "parameters": WEATHER_PARAMETERS}


def weather_result(city: Any) -> dict[str, Any]:
    return {"city": city, "conditions": "sunny", "temperature_c": 21}


def fixture_pcm(name: str, rate: int, trailing_silence_s: float = TRAILING_SILENCE_S) -> bytes:
    """A 16 kHz mono fixture as 16-bit PCM at `rate` (linear interpolation), plus trailing silence."""
    with wave.open(str(DATA / name)) as wav:
        assert wav.getnchannels() == 1 and wav.getsampwidth() == 2
        src_rate = wav.getframerate()
        samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.float64)
    if rate != src_rate:
        n_out = int(round(len(samples) * rate / src_rate))
        samples = np.interp(np.arange(n_out) * src_rate / rate, np.arange(len(samples)), samples)
    pcm = np.clip(np.round(samples), -32768, 32767).astype("<i2").tobytes()
    return pcm + b"\0\0" * int(rate * trailing_silence_s)


def chunks(pcm: bytes, rate: int, chunk_ms: int = 100) -> list[bytes]:
    size = rate * 2 * chunk_ms // 1000
    return [pcm[i:i + size] for i in range(0, len(pcm), size)]


class LogCapture(logging.Handler):
    """Collects records of WARNING and above from the named stdlib loggers while active."""

    def __init__(self, *names: str) -> None:
        super().__init__(level=logging.WARNING)
        self.names = names
        self.records: list[logging.LogRecord] = []
        self._saved: list[tuple[logging.Logger, int, bool]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> LogCapture:
        for name in self.names:
            lg = logging.getLogger(name)
            self._saved.append((lg, lg.level, lg.propagate))
            if lg.level == logging.NOTSET or lg.level > logging.WARNING:
                lg.setLevel(logging.WARNING)
            lg.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for lg, level, _ in self._saved:
            lg.removeHandler(self)
            lg.setLevel(level)

    @staticmethod
    def _text(record: logging.LogRecord) -> str:
        text = f"{record.name} {record.levelname}: {record.getMessage()}"
        if record.exc_info and record.exc_info[1] is not None:
            text += f" [{type(record.exc_info[1]).__name__}: {str(record.exc_info[1])[:1500]}]"
        return text

    def errors(self) -> list[str]:
        return [self._text(r) for r in self.records if r.levelno >= logging.ERROR]

    def warnings(self) -> list[str]:
        return [self._text(r) for r in self.records if r.levelno == logging.WARNING]


async def wait_until(predicate: Callable[[], bool], timeout: float, what: str, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise asyncio.TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(poll)


def compact_error(exc: BaseException, limit: int = 8) -> str:
    """A pydantic ValidationError as `loc: msg (input)` lines; anything else as its repr."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return f"{type(exc).__name__}: {str(exc)[:1500]}"
    try:
        items = errors()
    except Exception:
        return f"{type(exc).__name__}: {str(exc)[:1500]}"
    parts = []
    for err in items[:limit]:
        loc = ".".join(str(x) for x in err.get("loc", ()))
        parts.append(f"{loc}: {err.get('msg')} (input {str(err.get('input'))[:120]!r})")
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return f"ValidationError x{len(items)}: " + "; ".join(parts) + more


def summarise_types(types: list[str | None]) -> list[str]:
    """Event types in order, runs of one type folded into `type x N`."""
    out: list[str] = []
    last, count = None, 0
    for t in [*types, object()]:
        if t == last:
            count += 1
            continue
        if last is not None:
            out.append(f"{last} x{count}" if count > 1 else str(last))
        last, count = t, 1
    return out


@dataclass
class StepOutcome:
    client: str
    step: str
    ok: bool = False  # the step's own checks held (responses completed, tool round trip done)
    client_errors: list[str] = field(default_factory=list)  # captured through the framework's hooks
    client_warnings: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # which of the step's checks did not hold
    responses: list[dict[str, Any]] = field(default_factory=list)  # as the client saw them
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    session_updates: list[dict[str, Any]] = field(default_factory=list)  # sent by the client
    server_errors: list[dict[str, Any]] = field(default_factory=list)  # `error` events the server sent: each fails
    sent: list[str] = field(default_factory=list)
    received: list[str] = field(default_factory=list)
    close: Any = None

    @property
    def passed(self) -> bool:
        """The step's checks held, the client caught no error, and the server sent no `error` event.

        Server errors count as the proxy saw them, whatever the client did with them: a framework
        may drop one it does not act on (pipecat ignores `response_cancel_not_active`, say), or
        get it after it stopped reading. No step provokes one on purpose."""
        return self.ok and not self.client_errors and not self.failures and not self.server_errors

    def fill_from(self, proxy: RecordingProxy) -> None:
        self.session_updates = proxy.events("c2s", "session.update")
        self.server_errors = [e.get("error", e) for e in proxy.events("s2c", "error")]
        self.sent = summarise_types([f.type or f.raw for f in proxy.frames("c2s")])
        self.received = summarise_types([f.type or f.raw for f in proxy.frames("s2c")])
        self.close = [c.close for c in proxy.connections]

    def report(self) -> str:
        lines = [f"[{self.client} / {self.step}] {'PASS' if self.passed else 'FAIL'}"]
        for title, items in (("failed checks", self.failures), ("client-side errors", self.client_errors),
                             ("client-side warnings", self.client_warnings),
                             ("server error events", [json.dumps(e) for e in self.server_errors])):
            if items:
                lines.append(f"  {title}:")
                lines.extend(f"    - {item[:3000]}" for item in items)
        lines.append(f"  responses seen by the client: {json.dumps(self.responses)[:2000]}")
        if self.tool_calls:
            lines.append(f"  tool calls: {json.dumps(self.tool_calls)[:1000]}")
        lines.append(f"  sent: {', '.join(self.sent)[:3000]}")
        lines.append(f"  received: {', '.join(self.received)[:4000]}")
        lines.append(f"  connection closes (who, code, reason): {self.close}")
        return "\n".join(lines)


async def run_bounded(outcome: StepOutcome, proxy: RecordingProxy, body, timeout: float) -> StepOutcome:
    """Run `body()` within `timeout`; a timeout or an exception becomes a failed check, never a hang."""
    try:
        await asyncio.wait_for(body(), timeout)
    except asyncio.TimeoutError as exc:
        outcome.failures.append(str(exc) or f"step timed out after {timeout:.0f}s")
    except Exception as exc:  # the driver reports; the test decides
        outcome.failures.append(f"{type(exc).__name__}: {str(exc)[:2000]}")
    outcome.fill_from(proxy)
    return outcome
