"""Load deploy YAMLs: `base_config` inheritance, platform overrides, validation.

Resolution of one file: its base (recursively resolved), then the file's own keys, then
the file's `platforms.<platform>` section. Mappings merge key by key, `stages` merge by
`stage_id` and `connectors` by `name`; any other list or value replaces the inherited one.
Each file is type-checked on its own, so an error names the file that holds the bad value;
cross-references and required keys are checked on the merged result. A deprecated key name
(`_RENAMED`) still loads, with a warning, and is renamed before merging.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from vllm_omni.config.errors import ConfigError, describe_validation_error, key_path
from vllm_omni.config.schema import PLATFORMS, DeployConfig

logger = logging.getLogger(__name__)

_LIST_KEYS = {"stages": "stage_id", "connectors": "name"}
_FILE_ONLY_KEYS = ("base_config", "platforms")
_RENAMED = {"duplex_session": "session_defaults"}  # deprecated top-level key -> its new name


def display_path(path: Path) -> str:
    """The path relative to the working directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def detect_platform() -> str:
    """The accelerator platform this process would run on (`cpu` when none)."""
    import torch

    if torch.cuda.is_available():
        return "rocm" if torch.version.hip else "cuda"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    if importlib.util.find_spec("torch_npu") is not None:
        return "npu"
    return "cpu"


def _read_yaml(path: Path, shown: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(shown, ["file not found"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(shown, [f"invalid YAML: {exc}"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(shown, [f"(top level): expected a mapping, got {type(data).__name__}"])
    return data


def _skip_partial(error: ErrorDetails) -> bool:
    """A single file may leave keys to its base; only a stage_id is needed to merge by."""
    if error["type"] == "missing":
        return error["loc"][-1] != "stage_id"
    return error["type"] == "too_short" and error["loc"] == ("stages",)


def _duplicates(body: dict[str, Any], prefix: tuple[str, ...]) -> list[str]:
    problems = []
    for list_key, id_key in _LIST_KEYS.items():
        entries = body.get(list_key)
        if not isinstance(entries, list):
            continue
        seen: dict[Any, int] = {}
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict) or id_key not in entry:
                continue
            where = key_path([*prefix, list_key, index, id_key])
            if entry[id_key] in seen:
                problems.append(f"{where}: duplicate {id_key} {entry[id_key]!r} "
                                f"(also {list_key}[{seen[entry[id_key]]}])")
            else:
                seen[entry[id_key]] = index
    return problems


def _check_partial(body: dict[str, Any], shown: str, prefix: tuple[str, ...] = ()) -> list[str]:
    """Type errors, unknown keys and duplicates in what one file (or section) says."""
    problems = []
    if prefix:  # inside a platform section: inheritance keys belong at the top of a file
        for key in _FILE_ONLY_KEYS:
            if key in body:
                problems.append(f"{key_path([*prefix, key])}: unknown key")
    for old, new in _RENAMED.items():
        if old in body and new in body:
            problems.append(f"{key_path([*prefix, old])} and {key_path([*prefix, new])} are both given "
                            f"({old} is the deprecated name of {new}); keep only {new}")
        elif old in body:
            _warn_deprecated(f"{shown}: {key_path([*prefix, old])} is deprecated; rename it to {new}")
    # Validated as written (the schema accepts the deprecated names too), so an error names the key
    # the file holds; a deprecated key beside its new name is reported above, not as an unknown key.
    skipped = {*_FILE_ONLY_KEYS, *(old for old, new in _RENAMED.items() if new in body)}
    checked = {k: v for k, v in body.items() if k not in skipped}
    try:
        DeployConfig.model_validate(checked)
    except ValidationError as exc:
        problems += describe_validation_error(exc, prefix, skip=_skip_partial)
    return problems + _duplicates(body, prefix)


def _warn_deprecated(message: str) -> None:
    """A warning for code (warnings) and for the operator reading the server log (logging)."""
    warnings.warn(message, DeprecationWarning, stacklevel=2)
    logger.warning(message)


def _renamed(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with deprecated keys under their new names, so old and new names merge."""
    return {_RENAMED.get(key, key): value for key, value in body.items()}


def _merge(base: Any, override: Any, key: str | None = None) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for k, v in override.items():
            merged[k] = _merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return merged
    if key in _LIST_KEYS and isinstance(base, list) and isinstance(override, list):
        id_key = _LIST_KEYS[key]
        merged_list = [copy.deepcopy(entry) for entry in base]
        position = {entry.get(id_key): i for i, entry in enumerate(merged_list)}
        for entry in override:
            if entry.get(id_key) in position:
                i = position[entry[id_key]]
                merged_list[i] = _merge(merged_list[i], entry)
            else:
                merged_list.append(copy.deepcopy(entry))
        return merged_list
    return copy.deepcopy(override)


def _resolve(path: Path, platform: str, chain: tuple[Path, ...]) -> dict[str, Any]:
    shown = display_path(path)
    data = _read_yaml(path, shown)
    problems = _check_partial(data, shown)
    platforms = data.get("platforms", {})
    if not isinstance(platforms, dict):
        problems.append(f"platforms: expected a mapping, got {platforms!r}")
        platforms = {}
    for name, section in platforms.items():
        if name not in PLATFORMS:
            problems.append(f"platforms.{name}: unknown platform (expected one of {', '.join(PLATFORMS)})")
        elif not isinstance(section, dict):
            problems.append(f"platforms.{name}: expected a mapping, got {section!r}")
        else:
            problems += _check_partial(section, shown, ("platforms", name))
    base_ref = data.get("base_config")
    if base_ref is not None and not isinstance(base_ref, str):
        problems.append(f"base_config: expected a file path, got {base_ref!r}")
    if problems:
        raise ConfigError(shown, problems)

    resolved: dict[str, Any] = {}
    if base_ref is not None:
        base_path = (path.parent / base_ref).resolve()
        if base_path in chain:
            cycle = " -> ".join(display_path(p) for p in (*chain, base_path))
            raise ConfigError(shown, [f"base_config: inheritance cycle: {cycle}"])
        if not base_path.is_file():
            raise ConfigError(shown, [f"base_config: file not found: {display_path(base_path)}"])
        resolved = _resolve(base_path, platform, (*chain, base_path))
    own = {k: v for k, v in data.items() if k not in _FILE_ONLY_KEYS}
    resolved = _merge(resolved, _renamed(own))
    return _merge(resolved, _renamed(platforms.get(platform, {})))


def _cross_references(config: DeployConfig) -> list[str]:
    """Connectors join existing stages, at most one per (from_stage, to_stage) pair."""
    problems = []
    stage_ids = {stage.stage_id for stage in config.stages}
    joined: dict[tuple[int, int], int] = {}
    for i, connector in enumerate(config.connectors):
        for end in ("from_stage", "to_stage"):
            if getattr(connector, end) not in stage_ids:
                problems.append(f"connectors[{i}].{end}: no stage with stage_id "
                                f"{getattr(connector, end)}")
        pair = (connector.from_stage, connector.to_stage)
        if pair in joined:
            first = joined[pair]
            problems.append(f"connectors[{i}]: connector {connector.name!r} joins stage {pair[0]} to stage "
                            f"{pair[1]}, as connectors[{first}] ({config.connectors[first].name!r}) already does")
        else:
            joined[pair] = i
    return problems


def _stage_rules(config: DeployConfig) -> list[str]:
    """Keys that only make sense with some backends."""
    restarts = [f"stages[{i}].restart_on_failure: needs backend 'vllm' or the deploy's `ray` (a torch stage "
                f"runs inside the server's process; got backend {stage.backend!r})"
                for i, stage in enumerate(config.stages)
                if stage.restart_on_failure and stage.backend != "vllm" and config.ray is None]
    backend_keys = (  # key, the backend it needs, whether a stage sets it, why
        ("nice", "vllm", lambda stage: stage.nice, "it is the niceness of a vLLM engine's processes"),
        ("torch_device", "torch", lambda stage: stage.torch_device != "cpu",
         "a vLLM stage runs on the platform's devices"),
        ("batch_requests", "torch", lambda stage: stage.batch_requests, "a vLLM engine batches its requests itself"))
    misplaced = [f"stages[{i}].{key}: needs backend '{backend}' ({why}; got backend {stage.backend!r})"
                 for key, backend, is_set, why in backend_keys
                 for i, stage in enumerate(config.stages) if is_set(stage) and stage.backend != backend]
    return restarts + misplaced


def load_deploy_config(path: str | os.PathLike[str], platform: str | None = None) -> DeployConfig:
    """Load, merge and validate a deploy YAML for `platform` (detected when None)."""
    path = Path(path)
    shown = display_path(path)
    if platform is None:
        platform = detect_platform()
    elif platform not in PLATFORMS:
        raise ConfigError(shown, [f"unknown platform {platform!r} (expected one of {', '.join(PLATFORMS)})"])
    merged = _resolve(path.resolve(), platform, (path.resolve(),))
    try:
        config = DeployConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(shown, describe_validation_error(exc)) from None
    problems = _duplicates(merged, ()) + _cross_references(config) + _stage_rules(config)
    if problems:
        raise ConfigError(shown, problems)
    return config


def _expand_dotted(overrides: dict[str, Any]) -> dict[str, Any]:
    """{'stages.0.engine_args.max_num_seqs': 2} -> {'stages': [{'stage_id': 0, ...}]}."""
    expanded: dict[str, Any] = {}
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        if parts[0] == "stages" and len(parts) > 1:
            nested: Any = value
            for part in reversed(parts[2:]):
                nested = {part: nested}
            nested = {"stages": [{"stage_id": int(parts[1]), **nested}]}
        else:
            nested = value
            for part in reversed(parts[1:]):
                nested = {part: nested}
            nested = {parts[0]: nested}
        expanded = _merge(expanded, nested)
    return expanded


def modify_stage_config(
    path: str | os.PathLike[str],
    overrides: dict[str, Any],
    out_path: str | os.PathLike[str] | None = None,
) -> Path:
    """Write a deploy YAML that inherits `path` and applies `overrides`; return its path.

    `overrides` is shaped like a deploy file (stages matched by `stage_id`) or uses dotted
    keys, e.g. `{"async_chunk": False, "stages.1.default_sampling_params.seed": 7}`.
    """
    base = Path(path).resolve()
    if out_path is None:
        import tempfile

        out = Path(tempfile.mkdtemp(prefix="vllm-omni-config-")) / base.name
    else:
        out = Path(out_path)
    derived = {"base_config": os.path.relpath(base, out.parent.resolve()), **_expand_dotted(overrides)}
    out.write_text(yaml.safe_dump(derived, sort_keys=False))
    load_deploy_config(out, platform="cpu")  # fail here, naming the key, not in a test later
    return out


def config_to_yaml(config: DeployConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
