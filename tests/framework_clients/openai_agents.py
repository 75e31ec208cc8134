"""openai-agents: `agents.realtime.RealtimeRunner` with default settings.

The runner's `OpenAIRealtimeWebSocketModel` sends its default `session.update` on connect
(semantic_vad, 24 kHz `audio/pcm` both ways, voice `ash`, transcription
`gpt-4o-mini-transcribe`, output_modalities ["audio"]); the driver changes only the model
name (`initial_model_settings={"model_name": ...}`, also in the URL) and the URL.

Steps: `send_audio` 100 ms chunks of 24 kHz PCM (the only PCM rate the SDK speaks);
`send_message` (conversation.item.create + response.create); greet-first and the forced
tool call through `RealtimeModelSendRawMessage` (a bare `response.create`, and
`response.create` with `tool_choice` naming the function) since the session has no other
way to ask for either. The session runs the tool itself and sends the function_call_output
and the follow-up response.create.

Hooks: every server event is validated by the SDK against the `openai` package's
`RealtimeServerEvent` union; a failure is logged on `openai.agents` ("Failed to validate
server event") and surfaces as a session `error` event carrying the pydantic
ValidationError. Server `error` events surface as session `error` events too, exceptions as
`raw_model_event` of type `exception` (and are raised from the session iterator). All of
those, and every ERROR record on `openai.agents`, are client-side errors.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

from tests.framework_clients.common import (
    AUDIO_FIXTURES,
    FIRST_EVENT_TIMEOUT_S,
    GREETING_INSTRUCTIONS,
    INSTRUCTIONS,
    STEP_TIMEOUT_S,
    TEXT_PROMPT,
    TOOL_PROMPT,
    LogCapture,
    StepOutcome,
    chunks,
    compact_error,
    fixture_pcm,
    run_bounded,
    wait_until,
    weather_result,
)
from tests.framework_clients.proxy import RecordingProxy

NAME = "openai_agents"
RATE = 24000


class _Tracker:
    def __init__(self, outcome: StepOutcome) -> None:
        self.outcome = outcome
        self.in_response = False
        self.armed = False  # set once the reply to the initial session.update is in
        self.seen: list[str] = []
        self.refused: str | None = None
        self.current: dict[str, Any] = {"audio_bytes": 0, "transcript": "", "text": ""}
        self.tool_ends: list[Any] = []
        self.turns_ended = 0  # response.done events the SDK accepted (RealtimeModelTurnEndedEvent)

    def on_event(self, event: Any) -> None:
        out = self.outcome
        if event.type == "error":
            err = event.error
            text = compact_error(err) if isinstance(err, BaseException) else (
                json.dumps(err.model_dump(exclude_none=True)) if hasattr(err, "model_dump") else repr(err))
            out.client_errors.append(f"session error event: {text}")
            code = getattr(err, "code", None)
            if code and self.armed and not self.in_response:
                self.refused = code
        elif event.type == "audio":
            self.current["audio_bytes"] += len(event.audio.data)
        elif event.type == "tool_start":
            out.tool_calls.append({"event": "tool_start", "tool": event.tool.name, "arguments": event.arguments})
        elif event.type == "tool_end":
            out.tool_calls.append({"event": "tool_end", "tool": event.tool.name, "output": str(event.output)})
            self.tool_ends.append(event)
        elif event.type == "raw_model_event":
            data = event.data
            if data.type == "exception":
                out.client_errors.append(f"exception event ({data.context}): {compact_error(data.exception)}")
            elif data.type == "turn_ended":
                self.turns_ended += 1
            elif data.type == "transcript_delta":
                self.current["transcript"] += data.delta
            elif data.type == "output_text_delta":
                self.current["text"] += data.delta
            elif data.type == "raw_server_event":
                raw = data.data
                self.seen.append(raw.get("type"))
                if raw.get("type") == "response.created":
                    self.in_response = True
                elif raw.get("type") == "response.done":
                    response = raw.get("response") or {}
                    out.responses.append({**self.current, "status": response.get("status"),
                                          "output": [o.get("type") for o in response.get("output") or []]})
                    self.current = {"audio_bytes": 0, "transcript": "", "text": ""}
                    self.in_response = False

    async def wait_responses(self, n: int, label: str) -> None:
        await wait_until(lambda: self.in_response or len(self.outcome.responses) >= n or self.refused,
                         FIRST_EVENT_TIMEOUT_S, f"{label}: response.created")
        await wait_until(lambda: len(self.outcome.responses) >= n or self.refused, STEP_TIMEOUT_S["audio_turns"],
                         f"{label}: response.done")
        if self.refused:
            raise RuntimeError(f"{label}: server refused the request ({self.refused})")
        try:
            await wait_until(lambda: self.turns_ended >= n, 5, "turn_ended")
        except asyncio.TimeoutError:
            self.outcome.failures.append(
                f"{label}: the SDK never ended the turn (it did not accept response.done), so it still "
                "holds back any further response.create")
        last = self.outcome.responses[n - 1]
        if last["status"] != "completed":
            self.outcome.failures.append(f"{label}: response status {last['status']!r}, expected 'completed'")
        elif not (last["audio_bytes"] or last["transcript"] or last["text"]) and "function_call" not in last["output"]:
            self.outcome.failures.append(f"{label}: the client received no audio and no text")


async def run_step(step: str, ws_url: str, *, api_key: str = "unused", model: str) -> StepOutcome:
    from agents import function_tool
    from agents.realtime import RealtimeAgent, RealtimeRunner
    from agents.realtime.model_inputs import RealtimeModelSendRawMessage

    outcome = StepOutcome(NAME, step)
    tracker = _Tracker(outcome)

    @function_tool
    def get_weather(city: Literal["Paris", "Oslo", "Tokyo"]) -> str:
        """Get the current weather in a city.

        Args:
            city: The city, e.g. Paris.
        """
        return json.dumps(weather_result(city))

    instructions = INSTRUCTIONS + (" " + GREETING_INSTRUCTIONS if step == "greet_first" else "")
    agent = RealtimeAgent(name="assistant", instructions=instructions,
                          tools=[get_weather] if step == "tool_call" else [])
    runner = RealtimeRunner(agent)

    with LogCapture("openai.agents") as logs:
        async with RecordingProxy(ws_url) as proxy:
            async def consume(session) -> None:
                try:
                    async for event in session:
                        tracker.on_event(event)
                except Exception as exc:  # a stored exception re-raised by the session iterator
                    outcome.client_errors.append(f"session iterator raised: {compact_error(exc)}")

            async def body() -> None:
                session = await runner.run(model_config={
                    "url": f"{proxy.ws_url}/v1/realtime?model={model}", "api_key": api_key,
                    "initial_model_settings": {"model_name": model}})
                async with session:
                    consumer = asyncio.create_task(consume(session))
                    try:
                        await _drive(step, session, tracker, RealtimeModelSendRawMessage)
                        outcome.ok = True
                    finally:
                        consumer.cancel()

            await run_bounded(outcome, proxy, body, STEP_TIMEOUT_S[step])
    outcome.client_errors.extend(f"log: {e[:1500]}" for e in logs.errors())
    outcome.client_warnings.extend(w[:1500] for w in logs.warnings())
    return outcome


async def _drive(step: str, session, tracker: _Tracker, raw) -> None:
    # The reply to the connect-time session.update (session.updated, or an error refusing it)
    # comes first, so a refusal of it is not taken for a refusal of the step's request.
    await wait_until(lambda: "session.updated" in tracker.seen or "error" in tracker.seen, 15,
                     "the reply to the initial session.update")
    await asyncio.sleep(0.2)
    tracker.armed = True
    if step == "audio_turns":
        for n, name in enumerate(AUDIO_FIXTURES, start=1):
            for chunk in chunks(fixture_pcm(name, RATE), RATE):
                await session.send_audio(chunk)
            await tracker.wait_responses(n, f"audio turn {n} ({name})")
    elif step == "text_turn":
        await session.send_message(TEXT_PROMPT)
        await tracker.wait_responses(1, "text turn")
    elif step == "greet_first":
        await session.model.send_event(raw(message={"type": "response.create"}))
        await tracker.wait_responses(1, "greeting")
    elif step == "tool_call":
        await session.model.send_event(raw(message={"type": "conversation.item.create", "other_data": {
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TOOL_PROMPT}]}}}))
        await session.model.send_event(raw(message={"type": "response.create", "other_data": {
            "response": {"tool_choice": {"type": "function", "name": "get_weather"}}}}))
        await tracker.wait_responses(1, "forced tool call")
        if "function_call" not in tracker.outcome.responses[0]["output"]:
            tracker.outcome.failures.append("forced tool call: response.done lists no function_call item")
            return
        await wait_until(lambda: tracker.tool_ends, 30, "the session to run get_weather (tool_end)")
        await tracker.wait_responses(2, "reply after the tool output")
    else:
        raise ValueError(step)
