"""Deploy-config schema and loader (a leaf layer: imports nothing else of vllm_omni)."""

from vllm_omni.config.bundled import get_deploy_config_path
from vllm_omni.config.errors import ConfigError
from vllm_omni.config.loader import (
    config_to_yaml,
    detect_platform,
    load_deploy_config,
    modify_stage_config,
)
from vllm_omni.config.schema import (
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

__all__ = [
    "CodecChunking", "ConfigError", "ConnectorConfig", "DeployConfig", "EngineArgs", "PlaybackPacing",
    "RayCluster", "RayPlacement", "SamplingParams", "SessionDefaults", "StageConfig", "config_to_yaml",
    "detect_platform", "get_deploy_config_path", "load_deploy_config", "modify_stage_config",
]
