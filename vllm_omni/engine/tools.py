"""A request's function tools, checked before anything runs: each has a name and a valid
JSON schema for its arguments, and `tool_choice` names one of them (or auto / none /
required). Which tools a forced call may pick is decided here; how a call is written and
read is the model family's (`ModelFamily.tool_call_parser`)."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from vllm_omni.engine.request import OmniRequest, RequestError

CHOICES = ("auto", "none", "required")


def check_tools(tools: list[dict[str, Any]]) -> None:
    """Raise RequestError naming the first malformed tool."""
    names: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        name = tool.get("name") if isinstance(tool, dict) else None
        if not isinstance(name, str) or not name:
            raise RequestError(f"{where}.name: a function tool needs a name")
        if name in names:
            raise RequestError(f"{where}.name: {name!r} is given twice")
        names.add(name)
        parameters = tool.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise RequestError(f"{where}.parameters: expected a JSON schema object")
        try:
            Draft202012Validator.check_schema(parameters)
        except SchemaError as exc:
            raise RequestError(f"{where}.parameters: not a valid JSON schema: {exc.message}") from None


def offered_tools(request: OmniRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(the tools the prompt offers, the tools a forced call must pick from or None)."""
    choice = request.tool_choice
    if choice == "none" or not request.tools:
        if choice not in ("auto", "none"):
            raise RequestError(f"tool_choice: {choice!r} needs tools")
        return [], None
    check_tools(request.tools)
    if choice == "auto":
        return request.tools, None
    if choice == "required":
        return request.tools, request.tools
    named = [tool for tool in request.tools if tool["name"] == choice]
    if not named:
        raise RequestError(f"tool_choice: no tool named {choice!r} (tools: "
                           f"{', '.join(t['name'] for t in request.tools)})")
    return request.tools, named
