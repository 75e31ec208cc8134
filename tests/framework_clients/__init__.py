"""Drivers that run unchanged third-party realtime clients against a vllm-omni server.

One module per client: ``openai_sdk`` (the official ``openai`` SDK), ``openai_agents``
(``agents.realtime.RealtimeRunner`` with default settings), ``pipecat``
(``OpenAIRealtimeLLMService`` in a minimal pipeline) and ``livekit`` (the
``livekit-plugins-openai`` ``RealtimeModel`` session, no room). Each exposes::

    async def run_step(step: str, ws_url: str, *, api_key: str, model: str) -> StepOutcome

for the steps in ``common.STEPS``. A driver connects through ``proxy.RecordingProxy``, so
every frame each way is on record, and captures the client-side errors through the
framework's own hooks (error callbacks, error events, its loggers); see each module. Every
server ``error`` event the proxy saw fails the step too (``StepOutcome.passed``).

Run one against a running server: ``python -m tests.framework_clients <client> <ws_url> [step]``.
"""
