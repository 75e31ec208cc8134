"""LiveKit Agents: `livekit-plugins-openai` `RealtimeModel(base_url=...).session()`, no room.

The session is driven the way `AgentSession`/`AgentActivity` drive it, minus the room:
`update_instructions`, `update_tools`, `update_chat_ctx` (each chat item is a
conversation.item.create with the client's own item id and a `previous_item_id`, "root" for
the first; the session waits up to 5 s for the matching conversation.item.added) and
`generate_reply` (response.create carrying `metadata.client_event_id`, which the session
matches in response.created within 10 s). The model is built with the served model name and
otherwise defaults: semantic_vad, 24 kHz `audio/pcm` both ways, voice "marin",
transcription `gpt-4o-mini-transcribe`, max_output_tokens "inf".

Steps: audio is pushed as 16 kHz `rtc.AudioFrame`s (the session resamples to 24 kHz and
sends 100 ms appends); the text turn is a user message through `update_chat_ctx` then
`generate_reply()`; greet-first is `generate_reply(instructions=...)`; the tool call is
`generate_reply(tool_choice={"type": "function", "function": {"name": "get_weather"}})`,
then the `FunctionCallOutput` through `update_chat_ctx` and `generate_reply()`.

Hooks: the session builds events with the `openai` models' lenient `construct`, and a
handler that fails is logged on `livekit.agents` ("failed to handle event", ERROR, with the
exception); server `error` events are logged at ERROR and emitted as the session's "error"
event (`RealtimeModelError`). Client-side errors: every "error" event and every ERROR record
on `livekit.agents` / `livekit.plugins.openai` while the step runs.
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
    fixture_pcm,
    run_bounded,
    wait_until,
    weather_result,
)
from tests.framework_clients.proxy import RecordingProxy

NAME = "livekit"
INPUT_RATE = 16000


async def run_step(step: str, ws_url: str, *, api_key: str = "unused", model: str) -> StepOutcome:
    from livekit import rtc
    from livekit.agents import llm
    from livekit.plugins.openai.realtime import RealtimeModel

    outcome = StepOutcome(NAME, step)
    generations: list[dict[str, Any]] = []
    pending: list[asyncio.Task] = []

    @llm.function_tool
    async def get_weather(city: Literal["Paris", "Oslo", "Tokyo"]) -> str:
        """Get the current weather in a city.

        Args:
            city: The city, e.g. Paris.
        """
        return json.dumps(weather_result(city))

    async def consume(gen) -> None:
        record: dict[str, Any] = {"audio_bytes": 0, "text": "", "function_calls": [], "response_id": gen.response_id}
        readers = []

        async def read_message(msg) -> None:
            async def text() -> None:
                async for delta in msg.text_stream:
                    record["text"] += delta

            async def audio() -> None:
                async for frame in msg.audio_stream:
                    record["audio_bytes"] += len(bytes(frame.data))

            await asyncio.gather(text(), audio())

        async for msg in gen.message_stream:
            readers.append(asyncio.create_task(read_message(msg)))
        async for call in gen.function_stream:
            record["function_calls"].append(call)
        await asyncio.gather(*readers)
        generations.append(record)

    def on_generation(gen) -> None:
        pending.append(asyncio.create_task(consume(gen)))

    def on_error(event) -> None:
        err = event.error
        body = getattr(err, "body", None)
        detail = body.model_dump(exclude_none=True) if hasattr(body, "model_dump") else body
        outcome.client_errors.append(f"session error event (recoverable={event.recoverable}): {err} {detail}")

    with LogCapture("livekit.agents", "livekit.plugins.openai") as logs:
        async with RecordingProxy(ws_url) as proxy:
            realtime_model = RealtimeModel(model=model, api_key=api_key, base_url=f"{proxy.http_url}/v1")
            session = realtime_model.session()
            session.on("generation_created", on_generation)
            session.on("error", on_error)

            async def wait_generation(n: int, label: str) -> dict[str, Any]:
                def started() -> bool:
                    return len(proxy.events("s2c", "response.created")) >= n
                errors_before = len(outcome.client_errors)
                await wait_until(lambda: started() or len(outcome.client_errors) > errors_before,
                                 FIRST_EVENT_TIMEOUT_S, f"{label}: response.created")
                if not started():
                    raise RuntimeError(f"{label}: no response started; gave up after a client-side error")
                await wait_until(lambda: len(generations) >= n, STEP_TIMEOUT_S["audio_turns"],
                                 f"{label}: the generation's streams to close (response.done)")
                record = generations[n - 1]
                done = proxy.events("s2c", "response.done")
                status = done[n - 1]["response"].get("status") if len(done) >= n else None
                outcome.responses.append({k: (v if k != "function_calls" else [c.name for c in v])
                                          for k, v in record.items()} | {"status": status})
                if status != "completed":
                    outcome.failures.append(f"{label}: response status {status!r}, expected 'completed'")
                elif not (record["audio_bytes"] or record["text"] or record["function_calls"]):
                    outcome.failures.append(f"{label}: the generation carried no audio and no text")
                return record

            async def add_to_chat(*items) -> None:
                chat_ctx = session.chat_ctx.copy()
                chat_ctx.items.extend(items)
                await session.update_chat_ctx(chat_ctx)

            async def body() -> None:
                try:
                    await wait_until(lambda: proxy.events("s2c", "session.created"), 20, "session.created")
                    if step == "audio_turns":
                        for n, name in enumerate(AUDIO_FIXTURES, start=1):
                            for chunk in chunks(fixture_pcm(name, INPUT_RATE), INPUT_RATE):
                                session.push_audio(rtc.AudioFrame(data=chunk, sample_rate=INPUT_RATE, num_channels=1,
                                                                  samples_per_channel=len(chunk) // 2))
                            await wait_generation(n, f"audio turn {n} ({name})")
                    elif step == "text_turn":
                        await session.update_instructions(INSTRUCTIONS)
                        await add_to_chat(llm.ChatMessage(role="user", content=[TEXT_PROMPT]))
                        await session.generate_reply()
                        await wait_generation(1, "text turn")
                    elif step == "greet_first":
                        await session.update_instructions(INSTRUCTIONS)
                        await session.generate_reply(instructions=GREETING_INSTRUCTIONS)
                        await wait_generation(1, "greeting")
                    elif step == "tool_call":
                        await session.update_instructions(INSTRUCTIONS)
                        await session.update_tools([get_weather])
                        await add_to_chat(llm.ChatMessage(role="user", content=[TOOL_PROMPT]))
                        await session.generate_reply(
                            tool_choice={"type": "function", "function": {"name": "get_weather"}})
                        first = await wait_generation(1, "forced tool call")
                        if not first["function_calls"]:
                            outcome.failures.append("forced tool call: the generation's function_stream was empty")
                            return
                        call = first["function_calls"][0]
                        args = json.loads(call.arguments or "{}")
                        outcome.tool_calls.append({"name": call.name, "call_id": call.call_id, "arguments": args})
                        await add_to_chat(llm.FunctionCallOutput(call_id=call.call_id, name=call.name, is_error=False,
                                                                 output=json.dumps(weather_result(args.get("city")))))
                        await session.generate_reply()
                        await wait_generation(2, "reply after the tool output")
                    else:
                        raise ValueError(step)
                    outcome.ok = True
                finally:
                    for t in pending:
                        t.cancel()
                    await asyncio.wait_for(session.aclose(), 10)
                    await realtime_model.aclose()

            await run_bounded(outcome, proxy, body, STEP_TIMEOUT_S[step])
    outcome.client_errors.extend(f"log: {e[:1500]}" for e in logs.errors())
    outcome.client_warnings.extend(w[:1500] for w in logs.warnings())
    return outcome
