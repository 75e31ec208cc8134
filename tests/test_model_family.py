"""The family contract's seams: the registry finds a checkpoint's family, the engine checks
the deploy's stage graph against what the family routes, and `load_engine` serves a real
checkpoint through both."""

from __future__ import annotations

import asyncio

import pytest

from vllm_omni.config import get_deploy_config_path, load_deploy_config
from vllm_omni.engine import Message, OmniRequest
from vllm_omni.engine.graph import StageGraphError, check_stage_graph
from vllm_omni.models.qwen3_omni.family import Qwen3OmniFamily
from vllm_omni.models.registry import UnknownModelError, checkpoint_config, find_family, load_engine

TORCH_CONFIG = get_deploy_config_path("qwen3_omni_tiny_cpu_torch")


def qwen_graph(deploy):
    return check_stage_graph(deploy, Qwen3OmniFamily.name, Qwen3OmniFamily.roles, Qwen3OmniFamily.edges)


def test_registry_finds_the_family_by_architecture_or_model_type() -> None:
    assert find_family({"architectures": ["Qwen3OmniMoeForConditionalGeneration"]}).name == "qwen3_omni"
    assert find_family({"model_type": "qwen3_omni_moe"}).name == "qwen3_omni"
    with pytest.raises(UnknownModelError, match=r"LlamaForCausalLM.*known: Qwen3OmniMoeForConditionalGeneration"):
        find_family({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})


def test_bundled_connectors_are_the_families_edges() -> None:
    deploy = load_deploy_config(TORCH_CONFIG, platform="cpu")
    assert qwen_graph(deploy) == frozenset(Qwen3OmniFamily.edges)


def test_a_missing_connector_is_named() -> None:
    deploy = load_deploy_config(TORCH_CONFIG, platform="cpu")
    without = deploy.model_copy(update={"connectors": [c for c in deploy.connectors if c.to_stage != 1]})
    with pytest.raises(StageGraphError, match=r"no connector from stage 0 \(thinker\) to stage 1 \(talker\)"):
        qwen_graph(without)


def test_a_connector_the_family_never_uses_is_named() -> None:
    deploy = load_deploy_config(TORCH_CONFIG, platform="cpu")
    extra = deploy.connectors[0].model_copy(update={"name": "shortcut", "to_stage": 2, "extra": None})
    with pytest.raises(StageGraphError, match="connector 'shortcut' joins thinker to code2wav"):
        qwen_graph(deploy.model_copy(update={"connectors": [*deploy.connectors, extra]}))


def test_stage_roles_must_match_the_family() -> None:
    deploy = load_deploy_config(TORCH_CONFIG, platform="cpu")
    renamed = [s.model_copy(update={"role": "vocoder"}) if s.role == "code2wav" else s for s in deploy.stages]
    with pytest.raises(StageGraphError) as err:
        qwen_graph(deploy.model_copy(update={"stages": renamed}))
    assert "needs one stage with role 'code2wav'" in str(err.value)
    assert "stage 2 has role 'vocoder', which qwen3_omni does not use" in str(err.value)


def test_load_engine_serves_a_checkpoint_through_its_family(tiny_checkpoint) -> None:
    assert find_family(checkpoint_config(tiny_checkpoint)).name == "qwen3_omni"
    engine = load_engine(tiny_checkpoint, TORCH_CONFIG)
    try:
        assert engine.output_sample_rate == 24000 and engine.default_speaker in engine.speakers
        request = OmniRequest([Message("user", text="Hello.")], max_output_tokens=3,
                              sampling={"talker": {"max_tokens": 8}})
        final = asyncio.run(final_record(engine, request))
        assert final.finish_reason in ("stop", "length") and final.usage.text_tokens == len(final.token_ids) <= 3
        assert final.usage.audio_tokens == final.stage_metrics["talker"].outputs > 0
        assert {m.stage_id for m in final.stage_metrics.values()} == {0, 1, 2}
        with pytest.raises(Exception, match="sampling: no stage with role 'vocoder'"):
            asyncio.run(final_record(engine, OmniRequest([Message("user", text="Hi")], sampling={"vocoder": {}})))
    finally:
        engine.shutdown()


async def final_record(engine, request):
    return [output async for output in engine.generate(request)][-1]


