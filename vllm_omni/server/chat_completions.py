"""`POST /v1/chat/completions`: OpenAI's chat endpoint with spoken answers, whole or streamed
as server-sent events (docs/chat-completions.md).

I/O glue only: read a bounded body, check the model, take a slot from the same pool realtime
sessions take theirs from (a full server answers 429 at once), then let the session layer's
`ChatCompletion` run the engine request. Errors are OpenAI's JSON bodies with the status
each case calls for. The request stops when the client goes away: a streamed answer through
Starlette's disconnect listener, a whole one by watching the connection while it is made.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from vllm_omni.engine.interface import EngineClient
from vllm_omni.metrics import prometheus as metrics
from vllm_omni.protocol.chat_completions import ChatRequestError, error_body, parse_chat_request
from vllm_omni.protocol.chat_responses import DONE_EVENT, sse_event
from vllm_omni.protocol.errors import error_class
from vllm_omni.server.settings import ServerSettings
from vllm_omni.server.slots import SessionSlots
from vllm_omni.session.answer_audio import AnswerAudioStore
from vllm_omni.session.chat_completion import ENDPOINT, ChatCompletion
from vllm_omni.session.chat_messages import engine_messages

logger = logging.getLogger(__name__)
ERROR_TYPES = {429: "rate_limit_error", 500: "server_error", 503: "server_error", 504: "server_error"}


class ClientGone(Exception):
    """The client closed the connection before its whole answer was ready."""


def error_response(problem: ChatRequestError) -> JSONResponse:
    metrics.HTTP_REQUESTS.labels(endpoint=ENDPOINT, status=str(problem.status)).inc()
    kind = ERROR_TYPES.get(problem.status, error_class(problem.code))
    return JSONResponse(error_body(problem, kind), status_code=problem.status)


async def read_body(request: Request, limit: int) -> Any:
    """The request's JSON, at most `limit` bytes of it (413 beyond)."""
    too_large = ChatRequestError(f"The request body is larger than {limit} bytes.", None, "request_too_large", 413)
    if int(request.headers.get("content-length") or 0) > limit:
        raise too_large
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise too_large
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ChatRequestError("We could not parse the JSON body of your request: it must be a JSON object.",
                               None, "invalid_json") from None


async def until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(request: Request, work: asyncio.Future) -> Any:
    """`work`'s result, or ClientGone (and `work` cancelled) if the client leaves first."""
    watcher = asyncio.ensure_future(until_disconnected(request))
    try:
        done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if work not in done:
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        raise ClientGone
    return work.result()


def chat_completions_router(engine: EngineClient, settings: ServerSettings, slots: SessionSlots) -> APIRouter:
    router = APIRouter()
    answers = AnswerAudioStore(settings.answer_audio_ttl_s)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        release: Callable[[], None] | None = None
        completion: ChatCompletion | None = None
        try:
            chat, messages = parse_chat_request(await read_body(request, settings.max_request_body_bytes))
            if chat.model not in settings.served_model_names:
                raise ChatRequestError(f"The model `{chat.model[:200]}` does not exist.", "model", "model_not_found",
                                       404)
            release = slots.take(realtime=False)
            if release is None:
                raise ChatRequestError(f"The server is at capacity ({settings.max_sessions} sessions and requests); "
                                       "retry later.", None, "rate_limit_exceeded", 429)
            turns = await asyncio.to_thread(engine_messages, messages, answers)  # decodes audio and images
            completion = ChatCompletion(engine, chat, turns, answers, settings.http_request_timeout_s)
            metrics.HTTP_ACTIVE_REQUESTS.labels(endpoint=ENDPOINT).inc()
            await unless_client_leaves(request, asyncio.ensure_future(completion.start()))
            if chat.stream:
                metrics.HTTP_REQUESTS.labels(endpoint=ENDPOINT, status="200").inc()
                response = StreamingResponse(streamed(completion, release), media_type="text/event-stream",
                                             headers={"Cache-Control": "no-cache"})
                completion = release = None  # the stream owns them now
                return response
            answer = await unless_client_leaves(request, asyncio.ensure_future(completion.complete()))
            metrics.HTTP_REQUESTS.labels(endpoint=ENDPOINT, status="200").inc()
            return JSONResponse(answer)
        except ChatRequestError as problem:
            return error_response(problem)
        except ClientGone:
            metrics.HTTP_REQUESTS.labels(endpoint=ENDPOINT, status="499").inc()  # nginx's "client closed request"
            return Response(status_code=499)
        except Exception:  # a bug of ours: this request fails, the server goes on
            logger.exception("chat completion failed")
            return error_response(ChatRequestError("The server failed while answering.", None, "internal_error", 500))
        finally:
            await finish(completion, release)

    return router


async def finish(completion: ChatCompletion | None, release: Callable[[], None] | None) -> None:
    if completion is not None:
        await completion.close()
        metrics.HTTP_ACTIVE_REQUESTS.labels(endpoint=ENDPOINT).dec()
    if release is not None:
        release()


async def streamed(completion: ChatCompletion, release: Callable[[], None]) -> AsyncIterator[bytes]:
    """The answer's chunks as server-sent events, then `[DONE]`; however the stream ends (a
    client that went away cancels it), the engine request stops and the slot frees."""
    try:
        async for piece in completion.chunks():
            yield sse_event(piece)
            if "error" in piece:  # the answer failed: no [DONE]
                return
        yield DONE_EVENT
    finally:
        await finish(completion, release)
