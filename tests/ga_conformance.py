"""Checks server events against the official `openai` SDK's Realtime GA type models.

The SDK's models accept unknown fields (pydantic `extra="allow"`), so a plain parse would
let anything through: this walks the parsed model and reports every field the GA schema
does not define, beside every validation failure (missing fields, wrong enum values)."""

from __future__ import annotations

from typing import Any, get_args

from openai.types.realtime import RealtimeServerEvent
from pydantic import BaseModel, ValidationError


def _models_by_type() -> dict[str, type[BaseModel]]:
    union = get_args(RealtimeServerEvent)[0]  # Annotated[Union[...], discriminator]
    return {get_args(model.model_fields["type"].annotation)[0]: model for model in get_args(union)}


SERVER_EVENTS = _models_by_type()


def _extras(value: Any, where: str) -> list[str]:
    if isinstance(value, BaseModel):
        found = [f"{where}.{name}: not a GA field" for name in (value.model_extra or {})]
        for name in type(value).model_fields:
            found += _extras(getattr(value, name), f"{where}.{name}")
        return found
    if isinstance(value, (list, tuple)):
        return [problem for i, item in enumerate(value) for problem in _extras(item, f"{where}[{i}]")]
    if isinstance(value, dict):
        return [problem for key, item in value.items() for problem in _extras(item, f"{where}.{key}")]
    return []


def ga_problems(event: dict[str, Any]) -> list[str]:
    """What keeps `event` from being a GA server event; empty when it is one."""
    kind = event.get("type")
    model = SERVER_EVENTS.get(kind)
    if model is None:
        return [f"{kind}: not a GA server event type"]
    try:
        parsed = model.model_validate(event)
    except ValidationError as exc:
        return [f"{kind}: {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    return [f"{kind}: {problem}" for problem in _extras(parsed, "")]
