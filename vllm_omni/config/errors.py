"""ConfigError and the translation of pydantic errors into `file: key.path: message` lines."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails


class ConfigError(ValueError):
    """A deploy config is wrong. The message names the file and the key path."""

    def __init__(self, file: str, problems: Sequence[str]):
        self.file = file
        self.problems = list(problems)
        super().__init__("\n".join(f"{file}: {problem}" for problem in self.problems))


def key_path(loc: Iterable[str | int]) -> str:
    """('stages', 1, 'role') -> 'stages[1].role'."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(top level)"


_EXPECTED = {
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
}


def _describe(error: ErrorDetails) -> str:
    kind = error["type"]
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        return "unknown key"
    got = f", got {error['input']!r}"
    if kind in _EXPECTED:
        return _EXPECTED[kind] + got
    if kind in ("literal_error", "enum"):
        return f"expected one of {error['ctx']['expected']}{got}"
    return error["msg"][0].lower() + error["msg"][1:] + got


def describe_validation_error(
    exc: ValidationError, prefix: Sequence[str | int] = (), skip: Any = None
) -> list[str]:
    """One `key.path: message` line per error; `skip(error)` may drop some."""
    return [
        f"{key_path([*prefix, *error['loc']])}: {_describe(error)}"
        for error in exc.errors()
        if skip is None or not skip(error)
    ]
