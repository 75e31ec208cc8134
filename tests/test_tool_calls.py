"""Function tools in the engine: checked before anything runs, offered and answered the way
the checkpoint's chat template does it, calls read from the thinker's output (and kept
out of the spoken text). Forced calls run on vLLM (tests/test_vllm_backend.py)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from transformers import AutoTokenizer

from tests.engine_helpers import make_engine, run_request
from vllm_omni.engine import Message, OmniRequest, RequestError
from vllm_omni.engine.request import ToolCall
from vllm_omni.engine.tools import offered_tools
from vllm_omni.models.qwen3_omni.tool_calls import QwenToolCallParser, call_schema

WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


@pytest.fixture(scope="module")
def engine(tiny_loaded):
    built = make_engine(tiny_loaded)
    yield built
    built.shutdown()


def feed_all(parser: QwenToolCallParser, ids: list[int]) -> tuple[list[int], list[ToolCall]]:
    text, calls = [], []
    for token in ids:
        is_text, call = parser.feed(token)
        text += [token] if is_text else []
        calls += [call] if call else []
    return text, calls


def test_a_call_in_the_answer_is_read_and_kept_out_of_the_text(tokenizer) -> None:
    said = tokenizer.encode("Let me check.", add_special_tokens=False)
    call = tokenizer.encode('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
                            add_special_tokens=False)
    text, calls = feed_all(QwenToolCallParser(tokenizer, forced=False), said + call)
    assert text == said
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert calls[0].call_id.startswith("call_")


def test_a_forced_call_is_the_whole_answer_and_ends_with_it(tokenizer) -> None:
    parser = QwenToolCallParser(tokenizer, forced=True)
    text, calls = feed_all(parser, tokenizer.encode('{"name": "get_weather", "arguments": {"city": "Oslo"}}',
                                                    add_special_tokens=False))
    assert text == [] and calls == []
    finished = parser.finish()
    assert finished.name == "get_weather" and json.loads(finished.arguments) == {"city": "Oslo"}


def test_a_malformed_call_is_dropped(tokenizer) -> None:
    ids = tokenizer.encode("<tool_call>\n{not json\n</tool_call>", add_special_tokens=False)
    assert feed_all(QwenToolCallParser(tokenizer, forced=False), ids) == ([], [])


def test_call_schema_pins_the_name_and_the_arguments() -> None:
    assert call_schema([WEATHER])["properties"] == {"name": {"const": "get_weather"},
                                                   "arguments": WEATHER["parameters"]}
    assert len(call_schema([WEATHER, {**WEATHER, "name": "other"}])["anyOf"]) == 2


@pytest.mark.parametrize("tools, choice, message", [
    ([{"description": "no name"}], "auto", "tools[0].name: a function tool needs a name"),
    ([WEATHER, WEATHER], "auto", "tools[1].name: 'get_weather' is given twice"),
    ([{**WEATHER, "parameters": {"type": "no-such-type"}}], "auto", "tools[0].parameters: not a valid JSON schema"),
    ([{**WEATHER, "parameters": "city"}], "auto", "tools[0].parameters: expected a JSON schema object"),
    ([WEATHER], "get_time", "tool_choice: no tool named 'get_time'"),
    ([], "required", "tool_choice: 'required' needs tools"),
])
def test_bad_tools_are_named(tools, choice, message) -> None:
    request = OmniRequest([Message("user", text="hi")], tools=tools, tool_choice=choice)
    with pytest.raises(RequestError, match=re.escape(message)):
        offered_tools(request)


def test_tools_and_results_reach_the_prompt_as_the_template_writes_them(engine) -> None:
    call = ToolCall("call_1", "get_weather", json.dumps({"city": "Paris"}))
    conversation = [Message("user", text="Weather in Paris?"), Message("assistant", tool_calls=[call]),
                    Message("tool", text='{"forecast": "sunny, 21 C"}', tool_call_id="call_1")]
    request = OmniRequest(conversation, tools=[WEATHER], sampling={"thinker": {"max_tokens": 3},
                                                                   "talker": {"max_tokens": 8}})
    result = asyncio.run(run_request(engine, request))
    assert result["final"].finish_reason in ("stop", "length")
    rendered = engine.family.checkpoint.tokenizer.decode(engine.family.last_prompt.input_ids)
    assert '"name": "get_weather"' in rendered.split("\n</tools>")[0]  # offered in the system turn
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in rendered
    assert '<tool_response>\n{"forecast": "sunny, 21 C"}\n</tool_response>' in rendered


def test_forcing_a_call_on_the_torch_backend_is_refused_with_the_reason(engine) -> None:
    request = OmniRequest([Message("user", text="hi")], tools=[WEATHER], tool_choice="required")
    with pytest.raises(RequestError, match="structured outputs; the thinker stage runs on the torch backend"):
        asyncio.run(run_request(engine, request))
