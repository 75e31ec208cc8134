"""The orchestrator: builds the stage graph from a deploy config, runs stages on their
backends, moves data through connectors, streams outputs, aborts. Never imports server,
session or protocol."""

from vllm_omni.engine.orchestrator import OmniEngine
from vllm_omni.engine.request import (
    AudioChunk,
    AudioInputStream,
    EngineOutput,
    Message,
    OmniRequest,
    RequestError,
    RequestFinished,
    StageMetrics,
    StageUnavailableError,
    TextDelta,
)

__all__ = ["AudioChunk", "AudioInputStream", "EngineOutput", "Message", "OmniEngine", "OmniRequest",
           "RequestError", "RequestFinished", "StageMetrics", "StageUnavailableError", "TextDelta"]
