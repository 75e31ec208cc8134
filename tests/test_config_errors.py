"""Every ConfigError names the file and the key path of what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config_helpers import stage, write
from vllm_omni.config import ConfigError, load_deploy_config, modify_stage_config


def error_of(path: Path, platform: str = "cpu") -> str:
    with pytest.raises(ConfigError) as caught:
        load_deploy_config(path, platform=platform)
    return str(caught.value)


def test_wrong_type_names_file_and_key_path(tmp_path: Path) -> None:
    path = write(tmp_path, "x.yaml", {"stages": [
        stage(0), stage(1, "talker", default_sampling_params={"temperature": "hot"})]})
    assert error_of(path).endswith(
        "x.yaml: stages[1].default_sampling_params.temperature: expected a number, got 'hot'")


@pytest.mark.parametrize(("data", "expected"), [
    ({"stages": [stage(0)], "async_chunks": True}, "async_chunks: unknown key"),
    ({"stages": [stage(0, engine_args={"max_num_seq": 2})]},
     "stages[0].engine_args.max_num_seq: unknown key"),
    ({"stages": [stage(0, enforce_eager=True)]}, "stages[0].enforce_eager: unknown key"),
    ({"async_chunk": "yes", "stages": [stage(0)]}, "async_chunk: expected true or false, got 'yes'"),
    ({"stages": [stage(0, devices="0,1")]}, "stages[0].devices: expected a list, got '0,1'"),
    ({"stages": [stage(0, engine_args={"max_num_seqs": 2.5})]},
     "stages[0].engine_args.max_num_seqs: expected an integer, got 2.5"),
    ({"stages": [stage(0, role="speaker")]}, "stages[0].role: expected one of"),
    ({"session_mode": "half", "stages": [stage(0)]}, "session_mode: expected one of"),
    ({"stages": [stage(0, engine_args={"gpu_memory_utilization": 1.5})]},
     "stages[0].engine_args.gpu_memory_utilization: input should be less than or equal to 1"),
    ({"stages": [{"stage_id": 0, "backend": "torch"}]}, "stages[0].role: required key is missing"),
    ({"stages": [stage(0), stage(0, "talker")]},
     "stages[1].stage_id: duplicate stage_id 0 (also stages[0])"),
    ({"stages": [stage(0)], "connectors": [{"name": "a", "from_stage": 0, "to_stage": 5}]},
     "connectors[0].to_stage: no stage with stage_id 5"),
    ({"stages": [stage(0), stage(1, "talker")],
      "connectors": [{"name": "a", "from_stage": 0, "to_stage": 1}, {"name": "b", "from_stage": 0, "to_stage": 1}]},
     "connectors[1]: connector 'b' joins stage 0 to stage 1, as connectors[0] ('a') already does"),
    ({"stages": [stage(0), stage(1, "talker")],
      "connectors": [{"name": "a", "from_stage": 0, "to_stage": 1}, {"name": "a", "from_stage": 1, "to_stage": 0}]},
     "connectors[1].name: duplicate name 'a' (also connectors[0])"),
    # Keys that were validated and then ignored are gone: a file that sets one fails to load.
    ({"stages": [stage(0, replicas=2, cpu_cores=[0, 1, 2])]},
     "stages[0]: value error, cpu_cores: 2 replicas take equal groups of cpu_cores, got 3"),
    ({"stages": [stage(0, replicas=0)]}, "stages[0].replicas: input should be greater than 0"),
    ({"stages": [stage(0, input_connectors=["a"])]}, "stages[0].input_connectors: unknown key"),
    ({"stages": [stage(0)], "session_defaults": {"vad_threshold": 1.5}},
     "session_defaults.vad_threshold: input should be less than 1"),
    ({"stages": [stage(0)], "duplex_session": {"vad_threshold": 1.5}},  # the deprecated name, as written
     "duplex_session.vad_threshold: input should be less than 1"),
    ({"stages": [stage(0)], "duplex_session": {"max_sessions": 2}, "session_defaults": {"max_sessions": 3}},
     "duplex_session and session_defaults are both given (duplex_session is the deprecated name of "
     "session_defaults); keep only session_defaults"),
    ({"stages": [stage(0)], "platforms": {"cuda": {"duplex_session": {}, "session_defaults": {}}}},
     "platforms.cuda.duplex_session and platforms.cuda.session_defaults are both given"),
    ({"stages": [stage(0)], "connectors": [{"name": "a", "from_stage": 0, "to_stage": 0,
                                            "extra": {"codec_chunk_frames": 0}}]},
     "connectors[0].extra.codec_chunk_frames: input should be greater than 0"),
    ({"stages": [stage(0, restart_on_failure=True)]},
     "stages[0].restart_on_failure: needs backend 'vllm'"),
    ({"stages": [stage(0, nice=5)]}, "stages[0].nice: needs backend 'vllm'"),
    ({"stages": [stage(0, backend="vllm", nice=20)]}, "stages[0].nice: input should be less than or equal to 19"),
    ({"stages": [stage(0, backend="vllm", nice=-5)]}, "stages[0].nice: input should be greater than or equal to 0"),
    ({"stages": [stage(0)], "platforms": {"tpu": {}}}, "platforms.tpu: unknown platform"),
    ({"stages": [stage(0)], "platforms": {"cuda": {"stages": [{"stage_id": 0, "role": 3}]}}},
     "platforms.cuda.stages[0].role: expected one of"),
    ({"stages": [stage(0)], "platforms": {"cuda": {"base_config": "x.yaml"}}},
     "platforms.cuda.base_config: unknown key"),
    ({"stages": []}, "stages: list should have at least 1 item"),
    ("- just\n- a list\n", "(top level): expected a mapping, got list"),
    ("stages: [\n", "invalid YAML"),
])
def test_each_error_names_file_and_key(tmp_path: Path, data: dict | str, expected: str) -> None:
    message = error_of(write(tmp_path, "bad.yaml", data))
    assert message.startswith("bad.yaml: ") or "/bad.yaml: " in message
    assert expected in message


def test_error_in_base_file_names_the_base_file(tmp_path: Path) -> None:
    write(tmp_path, "base.yaml", {"stages": [stage(0, default_sampling_params={"top_k": "many"})]})
    child = write(tmp_path, "child.yaml", {"base_config": "base.yaml", "session_mode": "duplex"})
    message = error_of(child)
    assert "base.yaml: stages[0].default_sampling_params.top_k: expected an integer" in message
    assert "child.yaml" not in message


def test_base_config_cycle(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", {"base_config": "b.yaml", "stages": [stage(0)]})
    write(tmp_path, "b.yaml", {"base_config": "a.yaml"})
    message = error_of(tmp_path / "a.yaml")
    assert "base_config: inheritance cycle" in message
    assert "a.yaml -> " in message and "b.yaml -> " in message


def test_base_config_self_cycle(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, "self.yaml", {"base_config": "self.yaml", "stages": [stage(0)]}))
    assert "self.yaml: base_config: inheritance cycle" in message


def test_missing_base_file(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, "c.yaml", {"base_config": "gone.yaml", "stages": [stage(0)]}))
    assert "c.yaml: base_config: file not found" in message and "gone.yaml" in message


def test_missing_config_file(tmp_path: Path) -> None:
    assert "nothing.yaml: file not found" in error_of(tmp_path / "nothing.yaml")


def test_unknown_platform_argument(tmp_path: Path) -> None:
    path = write(tmp_path, "ok.yaml", {"stages": [stage(0)]})
    assert "unknown platform 'tpu'" in error_of(path, platform="tpu")


def test_all_problems_of_a_file_are_reported_together(tmp_path: Path) -> None:
    path = write(tmp_path, "many.yaml", {"colour": "red", "stages": [stage(0, devices=[-1])]})
    message = error_of(path)
    assert "colour: unknown key" in message and "stages[0].devices[0]" in message


def test_modify_stage_config_rejects_bad_override(tmp_path: Path) -> None:
    path = write(tmp_path, "ok.yaml", {"stages": [stage(0)]})
    with pytest.raises(ConfigError, match=r"stages\[0\]\.default_sampling_params\.temperature"):
        modify_stage_config(path, {"stages.0.default_sampling_params.temperature": "warm"},
                            out_path=tmp_path / "derived.yaml")
