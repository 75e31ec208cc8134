"""Responses of a turn-mode session: create (or defer one while another is active), cancel,
and the playback ledger clients acknowledge. At most one response is active at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from vllm_omni.engine.interface import EngineClient
from vllm_omni.engine.request import OmniRequest
from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.server_event_builders import output_audio_buffer_cleared, playback_acknowledged
from vllm_omni.protocol.server_events import new_id
from vllm_omni.protocol.session_config import SessionConfig
from vllm_omni.protocol.states import ResponseStatus
from vllm_omni.session.base import Emit
from vllm_omni.session.conversation import Conversation, Item, prompt_messages
from vllm_omni.session.response import ResponseRun
from vllm_omni.session.response_options import ResponseOptions, response_options

MAX_KEPT_RESPONSES = 64  # finished responses a session still answers playback acks for
NOT_ACTIVE = "response_cancel_not_active"  # GA's code for a cancel of no (or a finished) response


class ResponseController:
    """`config` gives the session's current settings; `resolve_input` turns a response.create
    `input` into items; `on_started` / `on_completed` tell the session when a response starts
    and when one completes (for its idle timer)."""

    def __init__(self, engine: EngineClient, emit: Emit, *,
                 conversation: Conversation, config: Callable[[], SessionConfig], default_speaker: str | None,
                 resolve_input: Callable[[list[Any]], Awaitable[list[Item]]],
                 produce: Callable[[ResponseRun, OmniRequest, str | None], None],
                 on_cancelled: Callable[[], None],
                 on_started: Callable[[], None], on_completed: Callable[[ResponseRun], None]):
        self.engine = engine
        self._emit = emit
        self.conversation = conversation
        self._config = config
        self._resolve_input = resolve_input
        self.default_speaker = default_speaker
        self._produce = produce  # starts a created response: the engine generates it, or a unit model is fed
        self._on_cancelled = on_cancelled
        self._on_started, self._on_completed = on_started, on_completed
        self.epoch = 0  # barge-ins and cancels so far
        self.active: ResponseRun | None = None
        self.responses: dict[str, ResponseRun] = {}
        self.last_response: ResponseRun | None = None
        self.unanswered = False  # user input in the conversation that no response has answered yet
        self._spoke = False  # a finished response produced audio
        self._deferred = False  # a server-initiated response waits for the active one to end

    # Creating ---------------------------------------------------------------------------------

    async def create(self, ev: ce.ResponseCreate) -> None:
        """response.create: answers the conversation so far (whatever it holds: with nothing new
        it is another reply, with nothing at all a greeting), or the response's own `input`."""
        self._refuse_while_active()
        options = self._options(ev.response.model_dump(exclude_unset=True))
        context = None if ev.response.input is None else await self._resolve_input(ev.response.input)
        self._refuse_while_active()  # the idle timer (§2.4.1) may have started one meanwhile
        self._start(options, context)

    def _refuse_while_active(self) -> None:
        if self.active is not None:
            raise ProtocolError("conversation_already_has_active_response",
                                f"Conversation already has an active response in progress: {self.active.id}. "
                                "Wait until the response is finished before creating a new one.")

    def respond_or_defer(self) -> None:
        """Answer the new input now, or once the active response has completed."""
        if self.active is not None:
            self._deferred = True
        else:
            self._start(self._options({}))

    def _options(self, overrides: dict[str, Any]) -> ResponseOptions:
        return response_options(self._config(), overrides, self.engine.speakers, self.default_speaker)

    def _start(self, options: ResponseOptions, context: list[Item] | None = None) -> None:
        """`context`: the items the response answers instead of the conversation."""
        run, previous = self._new_run(options, context)
        messages = prompt_messages(options.instructions, self.conversation.items if context is None else context)
        request = OmniRequest(messages, request_id=f"{run.session_id}-{run.id}", speaker=options.speaker,
                              modalities=tuple(options.modalities),
                              max_output_tokens=options.max_output_tokens if options.client_limited else None,
                              temperature=options.temperature, tools=options.tools, tool_choice=options.tool_choice,
                              affinity_key=run.session_id)
        self._produce(run, request, previous)

    def begin_fed(self) -> ResponseRun:
        """A response the session feeds unit by unit (a natively duplex model's turn), announced."""
        self._refuse_while_active()
        run, previous = self._new_run(self._options({}), None)
        run.open(previous)
        return run

    def _new_run(self, options: ResponseOptions, context: list[Item] | None) -> tuple[ResponseRun, str | None]:
        """The active response, its item in the conversation; (it, the previous item's id)."""
        self._on_started()
        response_id = new_id("resp_")
        item = Item(id=f"item_{response_id}", role="assistant", status="in_progress")
        # An out-of-band answer (conversation "none") does not enter the history, and leaves the
        # turn unanswered in the conversation.
        previous = self.conversation.add(item) if options.in_conversation else None
        run = ResponseRun(response_id, options, item, session_id=self._config().id, emit=self._emit,
                          on_done=self._done, record_item=self.conversation.add if options.in_conversation else None)
        self.active = self.last_response = run
        self.responses[response_id] = run
        if options.in_conversation and context is None:
            self.unanswered = False
        return run, previous

    @property
    def spoke(self) -> bool:
        """Whether any response of the session has produced audio."""
        return self._spoke or (self.active is not None and self.active.playback["generated_ms"] > 0)

    def _done(self, run: ResponseRun) -> None:
        if self.active is run:
            self.active = None
        self._spoke = self._spoke or run.playback["generated_ms"] > 0
        while len(self.responses) > MAX_KEPT_RESPONSES:  # acks and cancels name recent responses only
            del self.responses[next(iter(self.responses))]
        completed = run.status is ResponseStatus.COMPLETED
        run.item.awaiting_ack = completed and run.awaits_ack
        if completed:
            self._on_completed(run)
        if self._deferred and completed and self.unanswered:
            self._deferred = False
            self._start(self._options({}))
        elif not completed:
            self._deferred = False

    # Cancelling -------------------------------------------------------------------------------

    def cancel_active(self, reason: str) -> bool:
        """Cancel the active response (its text is cut to what was played); False if none."""
        run = self.active
        if run is None:
            return False
        self.epoch += 1
        run.cut_transcript(run.playback["committed_ms"])
        if not run.cancel(self.engine, reason):
            return False
        self._on_cancelled()
        return True

    def cancel(self, ev: ce.ResponseReference) -> None:
        """response.cancel (of the active response, or the one it names)."""
        if ev.response_id:
            run = self.responses.get(ev.response_id)
            if run is None or run.done:
                raise ProtocolError(NOT_ACTIVE, f"Cancellation failed: response {ev.response_id} is already "
                                    "complete", "response_id")
            if run is not self.active:
                raise ProtocolError(NOT_ACTIVE, f"Cancellation failed: response {ev.response_id} is not active",
                                    "response_id")
        elif self.active is None:
            raise ProtocolError(NOT_ACTIVE, "Cancellation failed: no active response found")
        self.cancel_active("client_cancelled")

    def clear_output(self, ev: ce.ResponseReference) -> None:
        """output_audio_buffer.clear: the client dropped the audio; an active response stops."""
        run = self.responses.get(ev.response_id) if ev.response_id else (self.active or self.last_response)
        self._emit(output_audio_buffer_cleared(response_id=run.id if run else None))
        if run is not None and run is self.active:
            self.cancel_active("output_audio_buffer_clear")

    # Playback ledger --------------------------------------------------------------------------

    def playback_ack(self, ev: ce.PlaybackAck) -> None:
        """playback.ack: how much of a response's audio the client played (and keeps)."""
        response_id = ev.response_id
        if response_id is None and ev.item_id and ev.item_id.startswith("item_"):
            response_id = ev.item_id[len("item_"):]
        if ev.item_id and response_id and ev.item_id != f"item_{response_id}":
            raise ProtocolError("playback_item_mismatch", "item_id must be item_<response_id>", "item_id")
        run = self.responses.get(response_id) if response_id else (self.active or self.last_response)
        if run is None:
            raise ProtocolError("playback_item_not_found", "no assistant item for that response", "response_id")
        if ev.played_ms is None:
            raise ProtocolError("missing_required_parameter", "Missing required parameter: 'played_ms'.",
                                "played_ms")
        played = max(0, int(ev.played_ms))
        committed = max(0, int(ev.committed_ms)) if ev.committed_ms is not None else played
        run.playback["played_ms"] = max(run.playback["played_ms"], played)
        run.playback["committed_ms"] = max(run.playback["committed_ms"], committed)
        if ev.truncate:
            run.cut_transcript(committed)
        if run.item.awaiting_ack and not run.awaits_ack:
            run.item.awaiting_ack = False  # heard in full: the whole text enters the history
        elif run.item.awaiting_ack and run.text_marks:  # the text heard so far, by the model's marks
            run.item.heard_chars = max(run.item.heard_chars, run.spoken_chars(run.playback["committed_ms"]))
        self._acknowledged(run.item.id, played, committed, ev.truncate, run)

    def truncated(self, item: Item, audio_end_ms: int) -> None:
        """After conversation.item.truncate: the item's response keeps what was played."""
        run = next((r for r in self.responses.values() if r.item is item), None)
        if run is not None:
            run.cut_transcript(audio_end_ms)
            run.playback["played_ms"] = run.playback["committed_ms"] = audio_end_ms
        self._acknowledged(item.id, audio_end_ms, audio_end_ms, True, run)

    def _acknowledged(self, item_id: str, played: int, committed: int, truncate: bool,
                      run: ResponseRun | None) -> None:
        self._emit(playback_acknowledged(session_id=self._config().id, epoch=self.epoch, item_id=item_id,
                                         played_ms=played, committed_ms=committed, truncate=truncate,
                                         playback=run.playback if run else {},
                                         history_committed=truncate or (run is not None and run.done and (
                                             not run.item.awaiting_ack or run.item.heard_chars > 0))))

    # End --------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop every response (no cancelled response.done is sent)."""
        run = self.active
        if run is not None and not run.done:
            run.done = True
            if run.request_id:
                await self.engine.abort(run.request_id)
        tasks = [r.task for r in self.responses.values() if r.task is not None and not r.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.active = None
