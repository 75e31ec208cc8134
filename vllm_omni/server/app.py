"""The FastAPI application: /v1/realtime, /v1/realtime/calls (WebRTC), /v1/duplex, /v1/chat/completions,
/v1/models, /health, /metrics, and the voice demo page at /."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from vllm_omni.engine.interface import ServedEngine
from vllm_omni.metrics import prometheus as metrics
from vllm_omni.server.auth import ApiKeyMiddleware
from vllm_omni.server.chat_completions import chat_completions_router
from vllm_omni.server.demo_page import add_demo_page
from vllm_omni.server.duplex_registry import DuplexRegistry
from vllm_omni.server.frontend_identity import FrontendHeader, FrontendIdentity
from vllm_omni.server.realtime import RealtimeConnection
from vllm_omni.server.settings import ServerSettings
from vllm_omni.server.slots import SessionSlots
from vllm_omni.server.webrtc_call import OpenCalls, webrtc_router
from vllm_omni.session.factory import SessionFactory


def create_app(engine: ServedEngine, settings: ServerSettings, frontend: FrontendIdentity | None = None) -> FastAPI:
    """The app of the one API server, or of one of several (`frontend`: server/frontends.py)."""
    slots = SessionSlots(settings.max_sessions)
    duplex_sessions = DuplexRegistry(settings.disconnect_grace_s, settings.idle_ttl_s, settings.reaper_interval_s,
                                     frontend)
    created = int(time.time())
    factory = SessionFactory(engine, settings.session_options())
    calls = OpenCalls()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        metrics.STAGE_REPLICAS.source = engine.replica_stats
        app.state.loop = asyncio.get_running_loop()
        app.state.duplex_sessions = duplex_sessions  # for tests and introspection
        reaper = asyncio.create_task(duplex_sessions.reap_idle())
        freeze_loaded_heap()
        yield
        gc.unfreeze()  # in a process that goes on (tests serve many apps), collect it again
        reaper.cancel()
        await asyncio.gather(reaper, return_exceptions=True)
        await duplex_sessions.close()
        await calls.close_all()
        metrics.STAGE_REPLICAS.source = None
        engine.shutdown()

    app = FastAPI(title="vllm-omni", lifespan=lifespan)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Routing errors (no such route, wrong method) in OpenAI's error shape."""
        body = {"error": {"message": str(exc.detail), "type": "invalid_request_error", "param": None, "code": None}}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key, protect_metrics=settings.protect_metrics)
    if frontend is not None:
        app.add_middleware(FrontendHeader, index=frontend.index)
    app.include_router(chat_completions_router(engine, settings, slots))
    app.include_router(webrtc_router(factory, settings, slots, calls))
    add_demo_page(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        dead = engine.unhealthy_stages()
        dead_replicas = [f"{r.role}[{r.replica}]" for r in engine.replica_stats() if not r.healthy]
        body = {"status": "error" if dead else "degraded" if dead_replicas else "ok", "active_sessions": slots.open,
                "active_requests": engine.num_active_requests(),
                "stage_active_requests": engine.active_requests_by_stage(), "dead_stages": dead,
                "dead_replicas": dead_replicas}
        return JSONResponse(body, status_code=503 if dead else 200)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "vllm-omni"}
            for name in settings.served_model_names]})

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.websocket("/v1/realtime")
    async def realtime(websocket: WebSocket) -> None:
        await RealtimeConnection(websocket, factory, settings, slots, duplex_sessions, frontend=frontend).serve()

    @app.websocket("/v1/duplex")
    async def duplex(websocket: WebSocket) -> None:
        await RealtimeConnection(websocket, factory, settings, slots, duplex_sessions, duplex_endpoint=True,
                                 frontend=frontend).serve()

    return app


def freeze_loaded_heap() -> None:
    """Take everything loaded so far (models, tokenizer, engine clients: about a million
    objects that live as long as the server) out of the garbage collector's full passes
    (`gc.freeze`). Such a pass runs on whatever thread allocates, the event loop included,
    and took about 0.5 s under load: every session's audio stalled at once."""
    gc.collect()
    gc.freeze()
