"""Function calling on the GA lane, on the scripted engine: tools reach the engine request, a
call becomes a function_call item with its GA events, and its output continues the answer."""

from __future__ import annotations

import json

from tests.ga_conformance import ga_problems
from tests.scripted_engine import Audio, Call, Text, turn_session

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


async def asked(**config):
    session, engine, events = turn_session(extensions=False, **config)
    await session.handle({"type": "session.update", "session": {"type": "realtime", "tools": [WEATHER]}})
    await session.handle({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}})
    return session, engine, events


async def test_a_call_becomes_a_function_call_item_with_its_events() -> None:
    session, engine, events = await asked()
    engine.script(Text("Let me look."), Audio(100), Call("get_weather", '{"city": "Paris"}', "call_7"))
    await session.handle({"type": "response.create", "response": {
        "tool_choice": {"type": "function", "name": "get_weather"}}})
    done = (await events.wait("response.done"))["response"]
    request = engine.requests[0]
    assert request.tools == [{k: WEATHER[k] for k in ("name", "description", "parameters")}]
    assert request.tool_choice == "get_weather"
    start = events.index(events.of("response.output_item.added")[1])
    assert events.kinds(start)[:6] == ["response.output_item.added", "response.function_call_arguments.delta",
                                       "response.function_call_arguments.done", "response.output_item.done",
                                       "conversation.item.done", "response.output_audio.done"]
    call_done = events.last("response.function_call_arguments.done")
    assert (call_done["call_id"], call_done["name"], json.loads(call_done["arguments"]), call_done["output_index"]) \
        == ("call_7", "get_weather", {"city": "Paris"}, 1)
    assert [o["type"] for o in done["output"]] == ["message", "function_call"]
    assert done["output"][1]["status"] == "completed" and done["output"][0]["content"][0]["transcript"] == \
        "Let me look."  # what was said before the call is still spoken
    added = [e for e in events.of("conversation.item.added") if e["item"]["type"] == "function_call"]
    assert len(added) == 1 and added[0]["item"]["call_id"] == "call_7"
    assert [p for e in events for p in ga_problems(e)] == []


async def test_a_function_call_output_continues_with_the_result_in_context() -> None:
    session, engine, events = await asked(instructions="Be brief.")
    engine.script(Call("get_weather", '{"city": "Paris"}', "call_7"))
    await session.handle({"type": "response.create"})
    await events.wait("response.done")
    await session.handle({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": "call_7", "output": '{"forecast": "sunny"}'}})
    await session.handle({"type": "response.create"})
    await events.wait("response.done", 2)
    messages = engine.requests[1].messages
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    assert [(c.call_id, c.name) for c in messages[2].tool_calls] == [("call_7", "get_weather")]
    assert (messages[3].text, messages[3].tool_call_id) == ('{"forecast": "sunny"}', "call_7")
    retrieved = [e for e in events.of("conversation.item.done") if e["item"]["type"] == "function_call_output"]
    assert retrieved[0]["item"]["output"] == '{"forecast": "sunny"}'


async def test_an_output_for_an_unknown_call_is_refused() -> None:
    session, engine, events = await asked()
    await session.handle({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": "call_nope", "output": "{}"}})
    assert events.errors() == ["invalid_function_call_output"]
    assert "call_nope" in events.last("error")["error"]["message"]


async def test_malformed_session_tools_are_refused_and_the_rest_of_the_update_applies() -> None:
    session, engine, events = turn_session(extensions=False, tools=[WEATHER])
    await session.handle({"type": "session.update", "event_id": "u1", "session": {
        "type": "realtime", "instructions": "Be brief.", "tool_choice": "required",
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "required": "city"}}]}})
    assert events.kinds() == ["error", "session.updated"]
    error = events.last("error")["error"]
    assert (error["code"], error["param"], error["event_id"]) == ("invalid_value", "session.tools", "u1")
    assert "not a valid JSON schema" in error["message"] and session.config.tools == [WEATHER]
    assert (session.config.instructions, session.config.tool_choice) == ("Be brief.", "required")
