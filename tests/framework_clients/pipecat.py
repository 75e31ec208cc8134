"""pipecat: `OpenAIRealtimeLLMService` in a minimal pipeline (no transport).

Pipeline: user context aggregator -> the service -> a recording sink -> assistant context
aggregator, as in pipecat's `examples/realtime/realtime-openai.py` with the transport left
out. The service is built with `base_url` (it appends `?model=`), the served model name and
otherwise default settings (`SessionProperties()`: no turn_detection field, so the server's
default applies; pipecat resamples input to 24 kHz and declares 24 kHz `audio/pcm`).

Steps: audio is `InputAudioRawFrame`s at the fixtures' 16 kHz (the service resamples); a text
turn and greet-first are a context (one user message, or none with the instructions set as
`system_instruction`) plus `LLMRunFrame`, which makes the service send its session.update,
the context's items and `response.create`. The tool call is forced with the session's
`tool_choice="required"` (pipecat offers no per-response tool_choice); the tool handler sets
it back to "auto" with an `LLMUpdateSettingsFrame` before it returns the result, so the
follow-up response the service creates after the function_call_output can answer in words.

Hooks: every server event is parsed with pipecat's own pydantic models
(`events.parse_server_event`); a failure raises out of the service's receive task, which
pipecat logs at ERROR ("... unexpected exception ...") and the connection stops being read.
Server `error` events become an `ErrorFrame` (the task's `on_pipeline_error` handler) and end
the receive loop, except codes `response_cancel_not_active` and
`conversation_already_has_active_response`. Client-side errors: every `on_pipeline_error`
frame and every loguru record at ERROR or above while the step runs.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from tests.framework_clients.common import (
    AUDIO_FIXTURES,
    FIRST_EVENT_TIMEOUT_S,
    GREETING_INSTRUCTIONS,
    INSTRUCTIONS,
    STEP_TIMEOUT_S,
    TEXT_PROMPT,
    TOOL_PROMPT,
    WEATHER_PARAMETERS,
    StepOutcome,
    chunks,
    fixture_pcm,
    run_bounded,
    wait_until,
    weather_result,
)
from tests.framework_clients.proxy import RecordingProxy

NAME = "pipecat"
INPUT_RATE = 16000  # what the pipeline carries; the service resamples to 24 kHz


async def run_step(step: str, ws_url: str, *, api_key: str = "unused", model: str) -> StepOutcome:
    from loguru import logger
    from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
    from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
    from pipecat.frames.frames import (
        InputAudioRawFrame,
        LLMFullResponseEndFrame,
        LLMRunFrame,
        LLMTextFrame,
        LLMUpdateSettingsFrame,
        TTSAudioRawFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.runner import PipelineRunner
    from pipecat.pipeline.task import PipelineParams, PipelineTask
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.services.openai.realtime.events import SessionProperties
    from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

    outcome = StepOutcome(NAME, step)
    seen: list[tuple[float, str, Any]] = []  # (time, "audio" | "text" | "end", value) as the sink saw them

    class Sink(FrameProcessor):
        """Stands where the output transport would: records what the service produced."""

        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            if direction == FrameDirection.DOWNSTREAM:
                if isinstance(frame, TTSAudioRawFrame):
                    seen.append((time.monotonic(), "audio", len(frame.audio)))
                elif isinstance(frame, LLMTextFrame):
                    seen.append((time.monotonic(), "text", frame.text))
                elif isinstance(frame, LLMFullResponseEndFrame):
                    seen.append((time.monotonic(), "end", None))
            await self.push_frame(frame, direction)

    def ends_after(t: float) -> float | None:
        return next((when for when, kind, _ in seen if kind == "end" and when >= t), None)

    instructions = INSTRUCTIONS + (" " + GREETING_INSTRUCTIONS if step == "greet_first" else "")
    properties = SessionProperties(tool_choice="required") if step == "tool_call" else SessionProperties()
    messages = {"text_turn": [{"role": "user", "content": TEXT_PROMPT}],
                "tool_call": [{"role": "user", "content": TOOL_PROMPT}]}.get(step, [])
    tools = ToolsSchema(standard_tools=[FunctionSchema(
        name="get_weather", description="Get the current weather in a city.",
        properties=WEATHER_PARAMETERS["properties"], required=WEATHER_PARAMETERS["required"])])
    context = LLMContext(messages, tools) if step == "tool_call" else LLMContext(messages)

    def on_log(message) -> None:
        record = message.record
        text = f"pipecat {record['level'].name}: {record['message'][:1500]}"
        if record["exception"] is not None and record["exception"].value is not None:
            text += f" [{type(record['exception'].value).__name__}]"
        (outcome.client_errors if record["level"].no >= 40 else outcome.client_warnings).append(text)

    sink_id = logger.add(on_log, level="WARNING")
    try:
        async with RecordingProxy(ws_url) as proxy:
            llm = OpenAIRealtimeLLMService(
                api_key=api_key, base_url=f"{proxy.ws_url}/v1/realtime",
                settings=OpenAIRealtimeLLMService.Settings(model=model, system_instruction=instructions,
                                                           session_properties=properties))

            async def get_weather(params) -> None:
                outcome.tool_calls.append({"name": params.function_name, "arguments": params.arguments,
                                           "tool_call_id": params.tool_call_id})
                sent = len(proxy.events("c2s", "session.update"))
                await task.queue_frame(LLMUpdateSettingsFrame(delta=OpenAIRealtimeLLMService.Settings(
                    session_properties=SessionProperties(tool_choice="auto"))))
                await wait_until(lambda: len(proxy.events("c2s", "session.update")) > sent, 10,
                                 "the service to send tool_choice=auto")
                await params.result_callback(weather_result(params.arguments.get("city")))

            llm.register_function("get_weather", get_weather)
            user_aggregator, assistant_aggregator = LLMContextAggregatorPair(context)
            pipeline = Pipeline([user_aggregator, llm, Sink(), assistant_aggregator])
            task = PipelineTask(pipeline, params=PipelineParams(), idle_timeout_secs=None,
                                check_dangling_tasks=False)

            @task.event_handler("on_pipeline_error")
            async def on_pipeline_error(_task, frame) -> None:
                outcome.client_errors.append(f"ErrorFrame: {str(frame.error)[:1500]}")

            runner = PipelineRunner(handle_sigint=False)
            running = asyncio.create_task(runner.run(task))

            async def wait_responses(n: int, label: str) -> None:
                await wait_until(lambda: proxy.events("s2c", "response.created")[n - 1:] or outcome.client_errors
                                 or running.done(), FIRST_EVENT_TIMEOUT_S, f"{label}: response.created")
                if outcome.client_errors and not proxy.events("s2c", "response.created")[n - 1:]:
                    raise RuntimeError(f"{label}: no response started; gave up after a client-side error")
                def done_frames():
                    return [f for f in proxy.frames("s2c") if f.type == "response.done"]

                # The service ends a response when it handles response.done (an LLMFullResponseEndFrame);
                # interruptions push that frame too, so each response is the sink's frames up to the
                # first end frame after the proxy passed on its response.done.
                await wait_until(lambda: (len(done_frames()) >= n and ends_after(done_frames()[n - 1].t))
                                 or outcome.client_errors or running.done(),
                                 STEP_TIMEOUT_S["audio_turns"], f"{label}: response.done")
                if not (len(done_frames()) >= n and ends_after(done_frames()[n - 1].t)):
                    why = "after a client-side error" if outcome.client_errors else "as the pipeline stopped"
                    raise RuntimeError(f"{label}: gave up waiting for the end of the response {why}")
                start = ends_after(done_frames()[n - 2].t) if n > 1 else 0.0
                end = ends_after(done_frames()[n - 1].t)
                window = [(kind, v) for when, kind, v in seen if start < when <= end]
                status = done_frames()[n - 1].event["response"].get("status")
                record = {"status": status, "audio_bytes": sum(v for k, v in window if k == "audio"),
                          "text": "".join(v for k, v in window if k == "text")}
                outcome.responses.append(record)
                if status != "completed":
                    outcome.failures.append(f"{label}: response status {status!r}, expected 'completed'")
                elif not (record["audio_bytes"] or record["text"]) and not (step == "tool_call" and n == 1):
                    outcome.failures.append(f"{label}: the pipeline got no audio and no text")

            async def body() -> None:
                try:
                    await wait_until(lambda: proxy.events("s2c", "session.created") or running.done(), 20,
                                     "session.created")
                    if step == "audio_turns":
                        for n, name in enumerate(AUDIO_FIXTURES, start=1):
                            for chunk in chunks(fixture_pcm(name, INPUT_RATE), INPUT_RATE):
                                await task.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=INPUT_RATE,
                                                                          num_channels=1))
                            await wait_responses(n, f"audio turn {n} ({name})")
                    elif step in ("text_turn", "greet_first"):
                        await task.queue_frame(LLMRunFrame())
                        await wait_responses(1, step.replace("_", " "))
                    elif step == "tool_call":
                        await task.queue_frame(LLMRunFrame())
                        await wait_responses(1, "forced tool call")
                        if not outcome.tool_calls:
                            outcome.failures.append("forced tool call: get_weather was never called")
                            return
                        await wait_responses(2, "reply after the tool output")
                        outputs = [e for e in proxy.events("c2s", "conversation.item.create")
                                   if e["item"].get("type") == "function_call_output"]
                        if not outputs:
                            outcome.failures.append("no function_call_output was sent")
                    outcome.ok = True
                finally:
                    await task.cancel()
                    try:
                        await asyncio.wait_for(running, 15)
                    except (asyncio.TimeoutError, Exception):
                        running.cancel()

            await run_bounded(outcome, proxy, body, STEP_TIMEOUT_S[step])
    finally:
        logger.remove(sink_id)
    outcome.tool_calls = [json.loads(json.dumps(c, default=str)) for c in outcome.tool_calls]
    return outcome
