"""Qwen's tool calls in the thinker's output: `<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>`
(both tags are single special tokens). Tokens between the tags write a call and are not
answer text; a forced call's prompt already opened the tag, so its tokens write the call
until the answer ends. A forced call's JSON shape is constrained by `call_schema`."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from vllm_omni.engine.request import ToolCall

logger = logging.getLogger(__name__)

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


def call_schema(tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """JSON schema of one call of any of `tools`: {"name": <its name>, "arguments": <its parameters>}."""
    shapes = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
               "properties": {"name": {"const": tool["name"]},
                              "arguments": tool.get("parameters") or {"type": "object"}}}
              for tool in tools]
    return shapes[0] if len(shapes) == 1 else {"anyOf": shapes}


class QwenToolCallParser:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, forced: bool):
        self.tokenizer = tokenizer
        self.open_id, self.close_id = tokenizer.convert_tokens_to_ids([CALL_OPEN, CALL_CLOSE])
        self._call: list[int] | None = [] if forced else None  # tokens of the call being written

    def feed(self, token_id: int) -> tuple[bool, ToolCall | None]:
        if self._call is None:
            if token_id != self.open_id:
                return True, None
            self._call = []
            return False, None
        if token_id == self.close_id:
            return False, self.finish()
        self._call.append(token_id)
        return False, None

    def finish(self) -> ToolCall | None:
        tokens, self._call = self._call, None
        if not tokens:
            return None
        text = self.tokenizer.decode(tokens, skip_special_tokens=True).strip()
        try:
            call = json.loads(text)
            name, arguments = call["name"], call.get("arguments", {})
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise ValueError("name must be a string and arguments an object")
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("dropping a malformed tool call (%s): %.200r", exc, text)
            return None
        return ToolCall(call_id=f"call_{uuid.uuid4().hex[:16]}", name=name, arguments=json.dumps(arguments))
