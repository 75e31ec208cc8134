"""Shared test fixtures: audio from tests/data and one tiny checkpoint per session."""

from __future__ import annotations

import os
import wave
from pathlib import Path

import numpy as np
import pytest

# Nothing in the tests may reach a model hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"  # see tests/data/README.md


# The fast tier (`make test-fast`, `-m "not slow"`): everything but what needs a checkpoint, an
# engine or a server process. An item is slow when it asks for one of these fixtures (directly
# or through another), or lives in one of these modules (they start processes themselves, or
# ask for the engines by name at run time: `request.getfixturevalue`).
HEAVY_FIXTURES = frozenset({"tiny_checkpoint", "minicpmo_checkpoint", "tiny_loaded", "vllm_engine",
                            "minicpmo_vllm_engine", "reference_engine", "moshi_checkpoint", "moshi_engine",
                            "qwen2_5_omni_checkpoint", "qwen2_5_omni_loaded", "turn_model",
                            "qwen2_5_omni_vllm_engine"})
SLOW_MODULES = frozenset({"test_docker_image", "test_ray_cluster", "test_demo_page", "test_cli", "test_client_cli",
                          "test_gpu_check_script", "test_scheduler_gaps", "test_duplex_lane_contract",
                          "test_duplex_wire_fields_contract", "test_s0_client_flow", "test_spec_native",
                          "test_moshi_realtime_load", "test_offline_api"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & HEAVY_FIXTURES or item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


def audio_fixture_path(name: str) -> Path:
    path = DATA / name
    if not path.is_file():
        raise FileNotFoundError(f"audio fixture {name} not found in {DATA}")
    return path


def read_fixture_pcm(name: str) -> np.ndarray:
    """A 16 kHz mono fixture as float32 in [-1, 1), trimmed to whole 10 ms mel hops."""
    with wave.open(str(audio_fixture_path(name))) as wav:
        assert wav.getframerate() == 16000 and wav.getnchannels() == 1
        samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    samples = samples[: len(samples) // 160 * 160]
    return samples.astype(np.float32) / 32768.0


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vllm_omni.models.qwen3_omni.tiny.checkpoint import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_qwen3_omni"), seed=0)


@pytest.fixture(scope="session")
def qwen2_5_omni_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vllm_omni.models.qwen2_5_omni.tiny.checkpoint import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_qwen2_5_omni"), seed=0)


@pytest.fixture(scope="session")
def moshi_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vllm_omni.models.moshi.tiny.checkpoint import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_moshi"), seed=0)


@pytest.fixture(scope="session")
def moshi_engine(moshi_checkpoint: Path):
    """The tiny Moshi served as configs/moshi_tiny_cpu.yaml deploys it (one per test run)."""
    from vllm_omni.models.registry import load_engine

    engine = load_engine(moshi_checkpoint, REPO / "configs" / "moshi_tiny_cpu.yaml")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def minicpmo_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny MiniCPM-o 4.5 checkpoint, its config and tokenizer classes registered."""
    from vllm_omni.models.minicpmo.config import register_hf_classes
    from vllm_omni.models.minicpmo.tiny.checkpoint import build_tiny_checkpoint
    from vllm_omni.models.minicpmo.tokenizer import register_tokenizer

    register_hf_classes()
    register_tokenizer()
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_minicpmo"), seed=0)


@pytest.fixture(scope="session")
def tiny_loaded(tiny_checkpoint: Path):
    """The tiny checkpoint loaded once for every engine in the session."""
    from vllm_omni.models.qwen3_omni.checkpoint import load_checkpoint

    return load_checkpoint(tiny_checkpoint)


@pytest.fixture(scope="session")
def qwen2_5_omni_loaded(qwen2_5_omni_checkpoint: Path):
    """The tiny Qwen2.5-Omni checkpoint loaded once for every engine in the session."""
    from vllm_omni.models.qwen2_5_omni.checkpoint import load_checkpoint

    return load_checkpoint(qwen2_5_omni_checkpoint)


@pytest.fixture(scope="session")
def qwen2_5_omni_vllm_engine(qwen2_5_omni_checkpoint: Path):
    """The tiny Qwen2.5-Omni on configs/qwen2_5_omni_tiny_cpu.yaml (the thinker on a vLLM CPU
    engine, about a minute to start), shared by the modules that test that deploy; its family
    keeps each request's codes (tests/qwen2_5_omni_helpers.py)."""
    from tests.engine_helpers import skip_without_vllm
    from tests.qwen2_5_omni_helpers import TINY_VLLM_CONFIG, make_engine

    skip_without_vllm()
    engine = make_engine(qwen2_5_omni_checkpoint, config=TINY_VLLM_CONFIG)
    yield engine
    engine.shutdown()


TURN_MODELS = {"qwen3_omni": "tiny_loaded", "qwen2_5_omni": "qwen2_5_omni_loaded"}


@pytest.fixture(scope="session", params=list(TURN_MODELS))
def turn_model(request: pytest.FixtureRequest):
    """Each turn-based model's loaded tiny checkpoint in turn: the spec-written suites run
    against every turn-based deploy (tests/realtime_helpers.py `running_server`)."""
    return request.getfixturevalue(TURN_MODELS[request.param])


@pytest.fixture(scope="session")
def vllm_engine(tiny_checkpoint: Path):
    """Thinker and talker on vLLM CPU engines (each takes about a minute to start), shared by
    every module that needs them; this process holds only code2wav and the bridge's modules,
    as in production. Stages restart when killed (tests/test_vllm_backend.py kills them)."""
    from tests.engine_helpers import make_engine
    from vllm_omni.models.qwen3_omni.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(tiny_checkpoint, bridge_only=True)
    engine = make_engine(checkpoint, async_chunk=True, thinker_backend="vllm", talker_backend="vllm",
                         restart_on_failure=True)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def minicpmo_vllm_engine(minicpmo_checkpoint: Path):
    """The tiny MiniCPM-o 4.5 on its vLLM deploy (configs/minicpmo_4_5_tiny_cpu.yaml), started
    once and served by every module that needs it (tests/realtime_helpers.py `serving(...,
    borrowed=True)`): each engine start costs about a minute on 2 cores."""
    from tests.engine_helpers import skip_without_vllm
    from vllm_omni.config import load_deploy_config
    from vllm_omni.models.registry import load_engine

    skip_without_vllm()
    engine = load_engine(minicpmo_checkpoint, load_deploy_config(REPO / "configs" / "minicpmo_4_5_tiny_cpu.yaml"))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def reference_engine(tiny_loaded):
    """The whole pipeline on torch in this process, one replica per stage: what replicated and
    distributed runs are compared with."""
    from tests.engine_helpers import make_engine

    engine = make_engine(tiny_loaded)
    yield engine
    engine.shutdown()
