"""Which model family serves a checkpoint, found by its config's `architectures` (or
`model_type`). The CLI, the offline API and the tests build engines through here; a new
family is its folder plus one entry in `FAMILIES`: a turn family's loader gives a
`ModelFamily` (engine/family.py) whose stage pipeline `OmniEngine` runs, a unit family's a
`UnitModel` (engine/native_duplex.py) that `NativeDuplexEngine` serves session by session."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_omni.config import DeployConfig, load_deploy_config
from vllm_omni.engine import OmniEngine
from vllm_omni.engine.family import ModelFamily
from vllm_omni.engine.native_duplex import NativeDuplexEngine
from vllm_omni.models.checkpoint_dir import local_checkpoint_dir


@dataclass(frozen=True)
class FamilyEntry:
    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    # "module:Class" with a `load(model, deploy, **options)` classmethod: a `ModelFamily`, or
    # (`units`) a `UnitModel`
    loader: str
    units: bool = False  # the model hears input unit by unit and decides its own turns


FAMILIES = (
    FamilyEntry("qwen3_omni", ("Qwen3OmniMoeForConditionalGeneration",), ("qwen3_omni_moe",),
                "vllm_omni.models.qwen3_omni.family:Qwen3OmniFamily"),
    FamilyEntry("qwen2_5_omni", ("Qwen2_5OmniModel", "Qwen2_5OmniForConditionalGeneration"), ("qwen2_5_omni",),
                "vllm_omni.models.qwen2_5_omni.family:Qwen25OmniFamily"),
    FamilyEntry("minicpmo_4_5", ("MiniCPMO",), ("minicpmo",),
                "vllm_omni.models.minicpmo.duplex_model:MiniCPMOUnitModel", units=True),
    FamilyEntry("moshi", ("MoshiForConditionalGeneration",), ("moshi",),
                "vllm_omni.models.moshi.unit_model:MoshiUnitModel", units=True),
)


class UnknownModelError(ValueError):
    """No registered family serves the checkpoint."""


def checkpoint_config(model: str | Path) -> dict[str, Any]:
    """The checkpoint's config.json, from a local folder or the local Hugging Face cache."""
    return json.loads((local_checkpoint_dir(model) / "config.json").read_text())


def find_family(config: dict[str, Any]) -> FamilyEntry:
    architectures = set(config.get("architectures") or ())
    for entry in FAMILIES:
        if architectures & set(entry.architectures) or config.get("model_type") in entry.model_types:
            return entry
    known = ", ".join(a for entry in FAMILIES for a in entry.architectures)
    raise UnknownModelError(f"no model family serves architectures {sorted(architectures)} "
                            f"(model_type {config.get('model_type')!r}); known: {known}")


def _load(entry: FamilyEntry, model: str | Path, deploy: DeployConfig, **options: Any) -> Any:
    module, _, name = entry.loader.partition(":")
    return getattr(importlib.import_module(module), name).load(model, deploy, **options)


def load_family(model: str | Path, deploy: DeployConfig, **options: Any) -> ModelFamily:
    entry = find_family(checkpoint_config(model))
    if entry.units:
        raise UnknownModelError(f"{entry.name} decides its own turns: it has no stage pipeline to load")
    return _load(entry, model, deploy, **options)


def load_engine(model: str | Path, deploy_config: str | Path | DeployConfig,
                **options: Any) -> OmniEngine | NativeDuplexEngine:
    """An engine serving `model` with the family its checkpoint belongs to."""
    deploy = deploy_config if isinstance(deploy_config, DeployConfig) else load_deploy_config(deploy_config)
    entry = find_family(checkpoint_config(model))
    if entry.units:
        return NativeDuplexEngine(_load(entry, model, deploy, **options))
    return OmniEngine(_load(entry, model, deploy, **options))
