"""Checks server events against the official `openai` SDK's Realtime GA type models.

The SDK's models are a floor, not the whole wire: every field they declare must validate, and
beyond them only the fields OpenAI's own server sends (`OPENAI_WIRE_FIELDS`, each listed and
validated) may appear. The models accept unknown fields (pydantic `extra="allow"`), so a plain
parse would let anything through: this walks the parsed model and reports every other field
the GA schema does not define, beside every validation failure (missing fields, wrong enum
values)."""

from __future__ import annotations

from typing import Any, Literal, get_args

from openai.types.realtime import RealtimeServerEvent
from pydantic import BaseModel, ValidationError


def _models_by_type() -> dict[str, type[BaseModel]]:
    union = get_args(RealtimeServerEvent)[0]  # Annotated[Union[...], discriminator]
    return {get_args(model.model_fields["type"].annotation)[0]: model for model in get_args(union)}


SERVER_EVENTS = _models_by_type()


class OpenAISessionFields(BaseModel):
    """What OpenAI's server puts in a session object beyond the SDK's model (docs/realtime-api.md §2.6)."""

    object: Literal["realtime.session"]
    id: str


# event type → {path of a model in the event: the fields OpenAI's server adds there}; both required
OPENAI_WIRE_FIELDS: dict[str, dict[str, type[BaseModel]]] = {
    "session.created": {".session": OpenAISessionFields},
    "session.updated": {".session": OpenAISessionFields},
}


def _extras(value: Any, where: str, wire: dict[str, type[BaseModel]]) -> list[str]:
    if isinstance(value, BaseModel):
        extra = dict(value.model_extra or {})
        found = []
        if where in wire:
            fields = wire[where]
            try:
                fields.model_validate({name: extra.pop(name) for name in fields.model_fields if name in extra})
            except ValidationError as exc:
                found += [f"{where}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        found += [f"{where}.{name}: not a GA field" for name in extra]
        for name in type(value).model_fields:
            found += _extras(getattr(value, name), f"{where}.{name}", wire)
        return found
    if isinstance(value, (list, tuple)):
        return [problem for i, item in enumerate(value) for problem in _extras(item, f"{where}[{i}]", wire)]
    if isinstance(value, dict):
        return [problem for key, item in value.items() for problem in _extras(item, f"{where}.{key}", wire)]
    return []


def ga_problems(event: dict[str, Any]) -> list[str]:
    """What keeps `event` from being a GA server event as OpenAI's server sends it; empty when it is one."""
    kind = event.get("type")
    model = SERVER_EVENTS.get(kind)
    if model is None:
        return [f"{kind}: not a GA server event type"]
    try:
        parsed = model.model_validate(event)
    except ValidationError as exc:
        return [f"{kind}: {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    return [f"{kind}: {problem}" for problem in _extras(parsed, "", OPENAI_WIRE_FIELDS.get(kind, {}))]
