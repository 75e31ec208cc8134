"""A deploy config means what it says: every schema key is read by the code that serves, and the
bundled configs set only schema keys.

The first is a static check: a key counts as read when code under `vllm_omni/` outside
`vllm_omni/config/` accesses an attribute of that name (`stage.devices`) or holds it as a string
(passed through by name: `PASSED_THROUGH = ("max_num_seqs", ...)` then `getattr(args, name)`).
Docstrings and comments do not count. Common words (`name`, `role`) always pass; the check is
for keys that the schema validated and nothing used (as `replicas` once was).
"""

from __future__ import annotations

import ast
import functools
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from vllm_omni.config import (
    CodecChunking,
    ConnectorConfig,
    DeployConfig,
    EngineArgs,
    PlaybackPacing,
    RayCluster,
    RayPlacement,
    SamplingParams,
    SessionDefaults,
    StageConfig,
)
from vllm_omni.config.bundled import BUNDLED_CONFIG_DIR

PACKAGE = Path(__file__).resolve().parents[1] / "vllm_omni"
CONFIG_PACKAGE = PACKAGE / "config"
FILE_ONLY_KEYS = ("base_config", "platforms")  # the loader's inheritance keys, not schema keys


def nested_models(annotation: Any) -> Iterator[type[BaseModel]]:
    """The pydantic models inside a field's type: `X`, `list[X]`, `X | None`."""
    if isinstance(annotation, type) and not typing.get_args(annotation) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from nested_models(arg)


def schema_models(model: type[BaseModel] = DeployConfig) -> list[type[BaseModel]]:
    """`model` and every model reachable through its fields, each once."""
    found = [model]
    for field in model.model_fields.values():
        for nested in nested_models(field.annotation):
            found += [m for m in schema_models(nested) if m not in found]
    return found


SCHEMA_KEYS = [(model, key) for model in schema_models() for key in model.model_fields]


def names_read(source: str) -> set[str]:
    """Attribute names loaded, and string constants other than docstrings, in one module."""
    tree = ast.parse(source)
    docstrings = {id(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names.add(node.value)
    return names


@functools.cache
def read_outside_config() -> dict[str, list[str]]:
    """Name -> the modules (outside vllm_omni/config/) that read it."""
    readers: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if CONFIG_PACKAGE in path.parents:
            continue
        module = str(path.relative_to(PACKAGE.parent))
        try:
            names = names_read(path.read_text())
        except SyntaxError as exc:
            pytest.fail(f"{module} does not parse, so the schema keys it reads cannot be checked: {exc}")
        for name in names:
            readers.setdefault(name, []).append(module)
    return readers


def test_the_walk_reaches_every_schema_model() -> None:
    assert set(schema_models()) == {DeployConfig, StageConfig, EngineArgs, SamplingParams, ConnectorConfig,
                                    CodecChunking, SessionDefaults, PlaybackPacing, RayCluster, RayPlacement}


@pytest.mark.parametrize(("model", "key"), SCHEMA_KEYS, ids=[f"{m.__name__}.{k}" for m, k in SCHEMA_KEYS])
def test_schema_key_is_read_outside_config(model: type[BaseModel], key: str) -> None:
    read = key in read_outside_config()
    assert read, (
        f"{model.__name__}.{key} is a dead key: the schema validates it, but nothing under vllm_omni/ outside "
        f"vllm_omni/config/ reads `.{key}` or passes {key!r} on by name. Make the code use it, or remove it "
        f"from the schema (and from configs/*.yaml), so a deploy file does not promise what the server ignores.")


def unknown_keys(data: dict[str, Any], model: type[BaseModel], where: str = "") -> Iterator[str]:
    """Key paths in `data` (a mapping validated by `model`) that are no field of the schema."""
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in model.model_fields:
            yield path
            continue
        for nested in nested_models(model.model_fields[key].annotation):
            items = value if isinstance(value, list) else [value]
            for i, item in enumerate(items):
                if isinstance(item, dict):
                    yield from unknown_keys(item, nested, f"{path}[{i}]" if isinstance(value, list) else path)


@pytest.mark.parametrize("path", sorted(BUNDLED_CONFIG_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_bundled_config_sets_only_schema_keys(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    sections = {"": {k: v for k, v in data.items() if k not in FILE_ONLY_KEYS}}
    sections |= {f"platforms.{name}": section for name, section in data.get("platforms", {}).items()}
    unknown = [key for where, section in sections.items() for key in unknown_keys(section, DeployConfig, where)]
    assert not unknown, f"configs/{path.name} sets keys the schema does not have: {', '.join(unknown)}"
