"""Deploy configs: bundled files, base_config inheritance, platform merge, modify_stage_config."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.config_helpers import stage, write
from vllm_omni.cli.serve_cmd import turn_detection_defaults
from vllm_omni.config import (
    ConfigError,
    config_to_yaml,
    get_deploy_config_path,
    load_deploy_config,
    modify_stage_config,
)
from vllm_omni.config import loader as loader_module
from vllm_omni.config.schema import PLATFORMS

BUNDLED = ["qwen3_omni_moe", "qwen3_omni_duplex", "qwen3_omni_tiny_cpu", "qwen3_omni_tiny_cpu_torch",
           "qwen3_omni_tiny_cpu_duplex", "qwen3_omni_tiny_gpu", "qwen3_omni_moe_ray", "qwen2_5_omni",
           "qwen2_5_omni_tiny_cpu_torch"]


@pytest.mark.parametrize("name", BUNDLED)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_bundled_configs_load_on_every_platform(name: str, platform: str) -> None:
    config = load_deploy_config(get_deploy_config_path(name), platform=platform)
    assert [s.role for s in config.stages] == ["thinker", "talker", "code2wav"]


def test_production_layout() -> None:
    config = load_deploy_config(get_deploy_config_path("qwen3_omni_moe"), platform="cuda")
    thinker, talker, code2wav = config.stage(0), config.stage(1), config.stage(2)
    assert config.async_chunk and config.session_mode == "turn"
    assert thinker.devices == [0] and talker.devices == [1] and code2wav.devices == [1]
    assert (thinker.backend, talker.backend, code2wav.backend) == ("vllm", "vllm", "torch")
    chunking = next(c for c in config.connectors if c.to_stage == 2).extra
    assert (chunking.initial_codec_chunk_frames, chunking.codec_chunk_frames,
            chunking.codec_left_context_frames, chunking.ramp_codec_chunks) == (1, 25, 25, True)
    assert config.playback_pacing.enabled
    sampling = talker.default_sampling_params
    assert (sampling.seed, sampling.temperature, sampling.top_k, sampling.repetition_penalty,
            sampling.max_tokens) == (42, 0.9, 50, 1.05, 4096)
    assert thinker.default_sampling_params.temperature == 0.0
    assert thinker.default_sampling_params.max_tokens == 2048


@pytest.mark.parametrize(("served_name", "platform"), [("qwen3_omni_tiny_cpu", "cpu"), ("qwen3_omni_tiny_gpu", "cuda")])
def test_tiny_configs_are_greedy_everywhere_and_differ_only_in_backends(served_name: str, platform: str) -> None:
    served = load_deploy_config(get_deploy_config_path(served_name), platform=platform)
    reference = load_deploy_config(get_deploy_config_path("qwen3_omni_tiny_cpu_torch"), platform="cpu")
    assert all(s.default_sampling_params.temperature == 0.0 for s in served.stages)
    assert [s.backend for s in served.stages] == ["vllm", "vllm", "torch"]
    assert [s.backend for s in reference.stages] == ["torch", "torch", "torch"]
    assert [s.default_sampling_params for s in served.stages] == [s.default_sampling_params for s in reference.stages]
    assert [s.engine_args.dtype for s in served.stages] == ["float32"] * 3  # exact comparison with the reference


def test_duplex_config_inherits_and_applies_platform() -> None:
    path = get_deploy_config_path("qwen3_omni_duplex.yaml")
    cuda = load_deploy_config(path, platform="cuda")
    cpu = load_deploy_config(path, platform="cpu")
    rocm = load_deploy_config(path, platform="rocm")
    assert cuda.session_mode == "duplex"
    assert cuda.stage(0).engine_args.limit_mm_per_prompt == {"audio": 16, "image": 8, "video": 0}
    assert cuda.stage(1).default_sampling_params.seed == 42  # from the base file
    assert cuda.stage(0).engine_args.max_num_seqs == 32  # the duplex file's cuda section
    assert cpu.stage(0).engine_args.max_num_seqs == 64  # no cpu section: the base value
    assert rocm.stage(0).engine_args.gpu_memory_utilization == 0.85  # the base file's rocm section


def test_inheritance_depth_two_merges_stages_by_id(tmp_path: Path) -> None:
    write(tmp_path, "grand.yaml", {
        "async_chunk": False,
        "stages": [stage(0, engine_args={"max_num_seqs": 4, "limit_mm_per_prompt": {"audio": 1}}),
                   stage(1, "talker", devices=[1])]})
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "parent.yaml", {  # base path is relative to the including file
        "base_config": "../grand.yaml",
        "stages": [{"stage_id": 1, "default_sampling_params": {"seed": 7}}]})
    child = write(tmp_path, "child.yaml", {
        "base_config": "sub/parent.yaml",
        "async_chunk": True,
        "stages": [{"stage_id": 0, "engine_args": {"max_num_seqs": 8}},
                   stage(2, "code2wav")]})
    config = load_deploy_config(child, platform="cpu")
    assert config.async_chunk is True
    assert [s.stage_id for s in config.stages] == [0, 1, 2]
    assert config.stage(0).engine_args.max_num_seqs == 8
    assert config.stage(0).engine_args.limit_mm_per_prompt == {"audio": 1}  # kept from grand
    assert config.stage(1).devices == [1] and config.stage(1).default_sampling_params.seed == 7


def test_platform_sections_override_by_stage_id(tmp_path: Path, monkeypatch) -> None:
    path = write(tmp_path, "p.yaml", {
        "stages": [stage(0, engine_args={"max_num_seqs": 4}), stage(1, "talker")],
        "platforms": {"rocm": {"async_chunk": False,
                               "stages": [{"stage_id": 1, "devices": [3]}]}}})
    rocm = load_deploy_config(path, platform="rocm")
    assert rocm.async_chunk is False and rocm.stage(1).devices == [3]
    assert rocm.stage(0).engine_args.max_num_seqs == 4
    assert load_deploy_config(path, platform="cuda").stage(1).devices == [0]
    monkeypatch.setattr(loader_module, "detect_platform", lambda: "rocm")
    assert load_deploy_config(path).stage(1).devices == [3]


def test_child_value_beats_base_platform_section(tmp_path: Path) -> None:
    write(tmp_path, "base.yaml", {
        "stages": [stage(0)],
        "platforms": {"cuda": {"stages": [{"stage_id": 0, "engine_args": {"max_num_seqs": 2}}]}}})
    child = write(tmp_path, "child.yaml", {
        "base_config": "base.yaml", "stages": [{"stage_id": 0, "engine_args": {"max_num_seqs": 9}}]})
    assert load_deploy_config(child, platform="cuda").stage(0).engine_args.max_num_seqs == 9


def test_modify_stage_config_flips_one_setting(tmp_path: Path) -> None:
    source = get_deploy_config_path("qwen3_omni_tiny_cpu")
    derived = modify_stage_config(source, {"async_chunk": False,
                                           "stages.2.engine_args.max_num_seqs": 3,
                                           "stages": [{"stage_id": 1,
                                                       "default_sampling_params": {"seed": 5}}]},
                                  out_path=tmp_path / "derived.yaml")
    before = load_deploy_config(source, platform="cpu").model_dump()
    after = load_deploy_config(derived, platform="cpu").model_dump()
    assert after["async_chunk"] is False
    assert after["stages"][2]["engine_args"]["max_num_seqs"] == 3
    assert after["stages"][1]["default_sampling_params"]["seed"] == 5
    # Everything else is unchanged.
    after["async_chunk"] = before["async_chunk"]
    for stage_id, section, key in ((2, "engine_args", "max_num_seqs"),
                                   (1, "default_sampling_params", "seed")):
        after["stages"][stage_id][section][key] = before["stages"][stage_id][section][key]
    assert after == before


def test_modify_stage_config_defaults_to_a_temp_file() -> None:
    derived = modify_stage_config(get_deploy_config_path("qwen3_omni_moe"),
                                  {"session_mode": "duplex"})
    assert derived.is_file()
    assert load_deploy_config(derived, platform="cuda").session_mode == "duplex"


def test_session_defaults_reach_the_server_as_turn_detection_defaults(tmp_path: Path) -> None:
    """serve_cmd hands them to ServerSettings.turn_detection_defaults, in the client's field names."""
    bundled = load_deploy_config(get_deploy_config_path("qwen3_omni_moe"), platform="cuda").session_defaults
    assert (bundled.max_sessions, bundled.server_vad_model_path) == (64, None)
    assert turn_detection_defaults(bundled) == {"threshold": 0.5, "silence_duration_ms": 500.0,
                                                "prefix_padding_ms": 300.0}
    path = write(tmp_path, "vad.yaml", {"stages": [stage(0)], "session_defaults": {
        "vad_threshold": 0.7, "vad_silence_duration_ms": 800, "vad_prefix_padding_ms": 0}})
    chosen = turn_detection_defaults(load_deploy_config(path, platform="cpu").session_defaults)
    assert chosen == {"threshold": 0.7, "silence_duration_ms": 800.0, "prefix_padding_ms": 0.0}
    assert all(type(value) is float for value in chosen.values())


def test_deprecated_duplex_session_still_loads_with_a_warning(tmp_path: Path, caplog) -> None:
    path = write(tmp_path, "old.yaml", {"stages": [stage(0)], "duplex_session": {"max_sessions": 5}})
    with caplog.at_level(logging.WARNING, logger="vllm_omni.config.loader"), \
            pytest.warns(DeprecationWarning, match=r"old\.yaml: duplex_session is deprecated; rename it to "
                                                   r"session_defaults"):
        config = load_deploy_config(path, platform="cpu")
    assert config.session_defaults.max_sessions == 5
    assert "duplex_session is deprecated" in caplog.text  # operators see it in the server log
    shown = config_to_yaml(config)
    assert "session_defaults:" in shown and "duplex_session" not in shown


def test_deprecated_name_in_a_base_file_merges_with_the_new_name(tmp_path: Path) -> None:
    write(tmp_path, "base.yaml", {"stages": [stage(0)], "duplex_session": {"max_sessions": 5, "vad_threshold": 0.3},
                                  "platforms": {"cuda": {"duplex_session": {"vad_prefix_padding_ms": 100}}}})
    child = write(tmp_path, "child.yaml", {"base_config": "base.yaml", "session_defaults": {"max_sessions": 9}})
    with pytest.warns(DeprecationWarning, match="base.yaml: platforms.cuda.duplex_session is deprecated"):
        defaults = load_deploy_config(child, platform="cuda").session_defaults
    assert (defaults.max_sessions, defaults.vad_threshold, defaults.vad_prefix_padding_ms) == (9, 0.3, 100)


def test_both_session_section_names_are_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "both.yaml", {"stages": [stage(0)], "duplex_session": {"max_sessions": 2},
                                         "session_defaults": {"max_sessions": 3}})
    with pytest.raises(ConfigError) as caught:
        load_deploy_config(path, platform="cpu")
    assert caught.value.problems == [
        "duplex_session and session_defaults are both given (duplex_session is the deprecated name of "
        "session_defaults); keep only session_defaults"]
