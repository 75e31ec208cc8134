"""The official `openai` SDK's realtime client (`AsyncOpenAI().realtime.connect`).

The SDK has no session defaults of its own: it sends what it is given. This driver sends
GA-shaped events only and relies on the server's GA defaults for the rest (24 kHz
`audio/pcm` input, `server_vad` turn detection), so the audio step checks those defaults.

Hooks: the SDK builds its events with `construct_type_unchecked` (no validation), so the
driver validates every server event it received, as recorded by the proxy, against the
SDK's own `RealtimeServerEvent` union with pydantic (the validation `openai-agents` applies
to the same events); each failure is a client-side error. `error` events count too.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from tests.framework_clients.common import (
    AUDIO_FIXTURES,
    FIRST_EVENT_TIMEOUT_S,
    GREETING_INSTRUCTIONS,
    INSTRUCTIONS,
    STEP_TIMEOUT_S,
    TEXT_PROMPT,
    TOOL_PROMPT,
    WEATHER_TOOL,
    StepOutcome,
    chunks,
    compact_error,
    fixture_pcm,
    run_bounded,
    weather_result,
)
from tests.framework_clients.proxy import RecordingProxy

NAME = "openai_sdk"
RATE = 24000


def _server_event_adapter():
    from typing import Annotated

    from openai.types.realtime.realtime_server_event import RealtimeServerEvent
    from pydantic import Field, TypeAdapter

    return TypeAdapter(Annotated[RealtimeServerEvent, Field(discriminator="type")])


def validation_errors(events: list[dict[str, Any]]) -> list[str]:
    adapter = _server_event_adapter()
    errors = []
    for event in events:
        try:
            adapter.validate_python(event)
        except Exception as exc:  # pydantic.ValidationError, or an unknown discriminator
            errors.append(f"{event.get('type')}: {compact_error(exc)}")
    return errors


class _Turns:
    """Reads the connection; one summary per response.done."""

    def __init__(self, connection, outcome: StepOutcome) -> None:
        self.connection = connection
        self.outcome = outcome
        self.audio = 0
        self.text = ""
        self.transcript = ""
        self.in_response = False

    async def until_done(self, start_timeout: float = FIRST_EVENT_TIMEOUT_S) -> dict[str, Any]:
        while True:
            if self.in_response:
                event = await self.connection.recv()
            else:
                try:
                    event = await asyncio.wait_for(self.connection.recv(), start_timeout)
                except asyncio.TimeoutError:
                    raise RuntimeError(f"no response.created within {start_timeout:.0f}s") from None
            if event.type == "response.created":
                self.in_response = True
            elif event.type == "response.output_audio.delta":
                self.audio += len(base64.b64decode(event.delta))
            elif event.type == "response.output_text.delta":
                self.text += event.delta
            elif event.type == "response.output_audio_transcript.delta":
                self.transcript += event.delta
            elif event.type == "error":
                self.outcome.client_errors.append(f"error event: {event.error.model_dump(exclude_none=True)}")
                if not self.in_response:  # the request was refused: no response is coming
                    raise RuntimeError(f"server refused the request: {event.error.code}")
            elif event.type == "response.done":
                response = event.response
                summary = {"status": response.status, "audio_bytes": self.audio, "text": self.text,
                           "transcript": self.transcript,
                           "output": [getattr(o, "type", None) for o in (response.output or [])]}
                self.outcome.responses.append(summary)
                self.audio, self.text, self.transcript, self.in_response = 0, "", "", False
                return {"summary": summary, "response": response}


def _completed_with_output(outcome: StepOutcome, done: dict[str, Any], label: str) -> None:
    summary = done["summary"]
    if summary["status"] != "completed":
        outcome.failures.append(f"{label}: response.done status {summary['status']!r}, expected 'completed'")
    elif not (summary["audio_bytes"] or summary["text"] or summary["transcript"]):
        outcome.failures.append(f"{label}: the response carried no audio and no text")


async def run_step(step: str, ws_url: str, *, api_key: str = "unused", model: str) -> StepOutcome:
    from openai import AsyncOpenAI

    outcome = StepOutcome(NAME, step)
    async with RecordingProxy(ws_url) as proxy:
        client = AsyncOpenAI(base_url=proxy.http_url + "/v1", api_key=api_key)

        async def body() -> None:
            async with client.realtime.connect(model=model) as connection:
                turns = _Turns(connection, outcome)
                if step == "audio_turns":
                    await connection.session.update(session={"type": "realtime", "instructions": INSTRUCTIONS})
                    for name in AUDIO_FIXTURES:
                        for chunk in chunks(fixture_pcm(name, RATE), RATE):
                            await connection.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
                        _completed_with_output(outcome, await turns.until_done(), name)
                elif step == "text_turn":
                    await connection.session.update(session={"type": "realtime", "instructions": INSTRUCTIONS})
                    await connection.conversation.item.create(item={
                        "type": "message", "role": "user", "content": [{"type": "input_text", "text": TEXT_PROMPT}]})
                    await connection.response.create()
                    _completed_with_output(outcome, await turns.until_done(), "text turn")
                elif step == "greet_first":
                    await connection.session.update(session={"type": "realtime", "instructions": INSTRUCTIONS})
                    await connection.response.create(response={"instructions": GREETING_INSTRUCTIONS})
                    _completed_with_output(outcome, await turns.until_done(), "greeting")
                elif step == "tool_call":
                    await connection.session.update(session={"type": "realtime", "instructions": INSTRUCTIONS,
                                                             "tools": [WEATHER_TOOL]})
                    await connection.conversation.item.create(item={
                        "type": "message", "role": "user", "content": [{"type": "input_text", "text": TOOL_PROMPT}]})
                    await connection.response.create(response={
                        "tool_choice": {"type": "function", "name": "get_weather"}})
                    first = await turns.until_done()
                    calls = [o for o in (first["response"].output or []) if o.type == "function_call"]
                    if not calls:
                        outcome.failures.append("forced tool call: response.done lists no function_call item")
                        return
                    call = calls[0]
                    try:
                        args = json.loads(call.arguments or "")
                    except ValueError:
                        outcome.failures.append(f"function_call arguments are not JSON: {call.arguments!r}")
                        return
                    outcome.tool_calls.append({"name": call.name, "call_id": call.call_id, "arguments": args})
                    if call.name != "get_weather" or not isinstance(args, dict) or "city" not in args:
                        outcome.failures.append(f"unexpected function call {call.name}({args})")
                    await connection.conversation.item.create(item={
                        "type": "function_call_output", "call_id": call.call_id,
                        "output": json.dumps(weather_result(args.get("city") if isinstance(args, dict) else None))})
                    await connection.response.create()
                    _completed_with_output(outcome, await turns.until_done(), "reply after the tool output")
                else:
                    raise ValueError(step)
                outcome.ok = True

        await run_bounded(outcome, proxy, body, STEP_TIMEOUT_S[step])
        outcome.client_errors.extend(f"validation: {e}" for e in validation_errors(proxy.events("s2c")))
    return outcome
