"""The family-independent engine: the contract model families implement (`family.py`,
`stage_api.py`), the orchestrator that runs any family's stage graph on its backends
(`backends/`), and the request/output types sessions use (`interface.py`, `request.py`).
Never imports server, session, protocol or model families."""

from vllm_omni.engine.interface import EngineClient
from vllm_omni.engine.orchestrator import OmniEngine
from vllm_omni.engine.request import (
    AudioChunk,
    AudioInputStream,
    EngineOutput,
    FinishReason,
    Message,
    OmniRequest,
    RequestError,
    RequestFinished,
    StageMetrics,
    StageUnavailableError,
    TextDelta,
    Usage,
)

__all__ = ["AudioChunk", "AudioInputStream", "EngineClient", "EngineOutput", "FinishReason", "Message", "OmniEngine",
           "OmniRequest", "RequestError", "RequestFinished", "StageMetrics", "StageUnavailableError", "TextDelta",
           "Usage"]
