"""GA function tools and tool_choice as the engine takes them (docs/realtime-api.md §4.8).

GA tools are `{"type": "function", "name", "description", "parameters"}`; `tool_choice` is
"auto", "none", "required" or `{"type": "function", "name": ...}`. The engine checks the
schemas (`engine/tools.py`); here its answer becomes a client error naming the field."""

from __future__ import annotations

from typing import Any

from vllm_omni.engine.request import RequestError, ToolChoice
from vllm_omni.engine.tools import check_tools
from vllm_omni.protocol.errors import ProtocolError


def engine_tools(tools: Any, where: str) -> list[dict[str, Any]]:
    """GA function tools as the engine's {"name", "description", "parameters"}; raises ProtocolError."""
    if not isinstance(tools, list):
        raise ProtocolError("invalid_value", "tools must be a list of function tools", where)
    converted = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise ProtocolError("invalid_value", "only tools of type 'function' are supported", f"{where}[{i}].type")
        converted.append({key: tool[key] for key in ("name", "description", "parameters") if key in tool})
    try:
        check_tools(converted)
    except RequestError as exc:
        raise ProtocolError("invalid_value", str(exc).removeprefix("tools"), where) from None
    return converted


def engine_tool_choice(choice: Any, where: str) -> ToolChoice:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return choice["name"]
    raise ProtocolError("invalid_value", "tool_choice must be auto, none, required or "
                        '{"type": "function", "name": ...}', where)
