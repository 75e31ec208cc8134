"""Stage replicas as Ray actors (a deploy config's `ray`): each replica's program runs in an
actor on a node that has the resources its `placement` asks for, and only the orchestrator
stays in the server process. Ray carries the messages to the actor and its events back, so
stage-to-stage traffic crosses nodes through Ray.

The actor (`StageActor`) wraps the program in the same `StageWorker` or `AsyncEngineStage`
as in one process. Towards the engine, `RayStageReplica` has the outside of those (submit,
drop, counts, health, restart), so the engine's routing does not change:

* Messages are numbered and the actor applies them in that order: Ray may start a threaded
  actor's calls out of order (an argument that travels through the object store arrives later).
* Events come back by long polling: the replica's thread asks the actor for what it has, which
  answers as soon as there is something or after EVENT_POLL_S, with the stage's counts.
* An actor that does not answer within the cluster's `liveness_timeout_s` is dead (Ray notices
  a lost node only after tens of seconds): the engine fails its requests, and `restart` puts a
  new actor in its place, which Ray starts once a node with the resources is there again.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vllm_omni.config import RayCluster, RayPlacement
from vllm_omni.engine.backends.async_stage import AsyncEngineStage
from vllm_omni.engine.backends.step_worker import ErrorSink, EventSink, StageWorker
from vllm_omni.engine.pacing import PaceSnapshot
from vllm_omni.engine.stage_api import AsyncStageDriver, StageProgram

logger = logging.getLogger(__name__)

EVENT_POLL_S = 0.2  # the longest an events call waits for an event
MAX_EVENTS = 256  # events per call
START_TIMEOUT_S = 900.0  # an actor waits for a node with its resources, then starts its engine
# One try at replacing a lost actor: one placed on a node that is down but not yet known to be
# can hang; after this long it goes, and the next health check tries again.
RESTART_TRY_S = 120.0
STOP_TIMEOUT_S = 30.0

ProgramFactory = Callable[[], StageProgram | AsyncStageDriver]


class RemoteStageError(Exception):
    """A stage failure inside an actor, as its type name and message."""


@dataclass(frozen=True)
class ReplicaState:
    healthy: bool = False
    num_requests: int = 0
    queue_depth: int = 0


def connect(cluster: RayCluster) -> None:
    """Join the Ray cluster as a driver (once per process)."""
    import ray

    if not ray.is_initialized():
        ray.init(address=cluster.address, namespace=cluster.namespace, log_to_driver=True)


class StageActor:
    """Inside the actor's process: one replica's program in its usual worker."""

    def __init__(self, role: str, build_program: ProgramFactory, max_active: int, torch_threads: int):
        torch.set_num_threads(torch_threads)
        self._events: queue.SimpleQueue[tuple[str, str, Any]] = queue.SimpleQueue()
        program = build_program()
        kind = AsyncEngineStage if isinstance(program, AsyncStageDriver) else StageWorker
        self._stage = kind(role, program, self._on_event, self._on_error, max_active=max_active)
        self._stage.start()
        self._next = 1
        self._held: dict[int, tuple[str, str, Any]] = {}
        self._lock = threading.Lock()

    def ready(self) -> str:
        """The id of the Ray node this actor runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def deliver(self, number: int, kind: str, request_id: str, message: Any) -> None:
        """Message `number` (from 1): applied once every earlier one has been."""
        with self._lock:
            self._held[number] = (kind, request_id, message)
            while self._next in self._held:
                kind, request_id, message = self._held.pop(self._next)
                self._next += 1
                if kind == "submit":
                    self._stage.submit(request_id, message)
                elif kind == "drop":
                    self._stage.drop(request_id)
                else:
                    self._stage.update_pace(message)

    def events(self, wait_s: float) -> tuple[list[tuple[str, str, Any]], ReplicaState]:
        taken: list[tuple[str, str, Any]] = []
        try:
            taken.append(self._events.get(timeout=wait_s))
            while len(taken) < MAX_EVENTS:
                taken.append(self._events.get_nowait())
        except queue.Empty:
            pass
        return taken, ReplicaState(self._stage.healthy(), self._stage.num_requests(), self._stage.queue_depth())

    def stop(self) -> None:
        self._stage.stop()

    def _on_event(self, role: str, request_id: str, event: object) -> None:
        self._events.put(("event", request_id, event))

    def _on_error(self, role: str, request_id: str, exc: Exception) -> None:
        self._events.put(("error", request_id, f"{type(exc).__name__}: {exc}"))


class RayStageReplica:
    """In the server process: one replica that lives in a Ray actor."""

    def __init__(self, role: str, build_program: ProgramFactory, on_event: EventSink, on_error: ErrorSink,
                 max_active: int, placement: RayPlacement, cluster: RayCluster):
        self.role, self.max_active = role, max_active
        self._build_program, self._placement, self._cluster = build_program, placement, cluster
        self._on_event, self._on_error = on_event, on_error
        self._lock = threading.Lock()
        self._actor: Any = None
        self._sent = 0
        self._state = ReplicaState()
        self._alive = False
        self.restarting = False
        self.node_id: str | None = None  # the Ray node of the current actor

    def start(self) -> None:
        self._start_actor(START_TIMEOUT_S)

    def _start_actor(self, timeout_s: float) -> None:
        import ray

        placement = self._placement
        actor = ray.remote(StageActor).options(
            num_cpus=placement.num_cpus, num_gpus=placement.num_gpus, resources=placement.resources,
            max_concurrency=2, max_restarts=0,  # one thread polls events, one takes messages
        ).remote(self.role, self._build_program, self.max_active, max(1, int(placement.num_cpus)))
        try:
            self.node_id = ray.get(actor.ready.remote(), timeout=timeout_s)
        except Exception:
            ray.kill(actor, no_restart=True)
            raise
        logger.info("stage %s: a Ray actor on node %s", self.role, self.node_id)
        with self._lock:  # a ready actor's stage has started (its counts come with each poll)
            self._actor, self._sent, self._alive, self._state = actor, 0, True, ReplicaState(healthy=True)
        threading.Thread(target=self._poll, args=(actor,), name=f"ray-{self.role}", daemon=True).start()

    def _send(self, kind: str, request_id: str, message: Any) -> None:
        with self._lock:
            if not self._alive:  # the replica's requests fail anyway
                return
            self._sent += 1
            self._actor.deliver.remote(self._sent, kind, request_id, message)

    def submit(self, request_id: str, message: object) -> None:
        self._send("submit", request_id, message)

    def drop(self, request_id: str) -> None:
        self._send("drop", request_id, None)

    def update_pace(self, snapshot: PaceSnapshot) -> None:
        self._send("pace", "", snapshot)

    def _poll(self, actor: Any) -> None:
        import ray

        while True:
            with self._lock:
                if actor is not self._actor or not self._alive:
                    return
            try:
                events, self._state = ray.get(actor.events.remote(EVENT_POLL_S),
                                              timeout=EVENT_POLL_S + self._cluster.liveness_timeout_s)
            except Exception as exc:  # the actor died, or its node went silent
                logger.warning("stage %s: its Ray actor is lost: %r", self.role, exc)
                with self._lock:
                    if actor is self._actor:
                        self._alive = False
                return
            for kind, request_id, payload in events:
                if kind == "event":
                    self._on_event(self.role, request_id, payload)
                else:
                    self._on_error(self.role, request_id, RemoteStageError(payload))

    def drop_all(self) -> None:
        """Forget the dead actor's requests (they died with it)."""
        self._state = ReplicaState()

    def num_requests(self) -> int:
        return self._state.num_requests if self._alive else 0

    def queue_depth(self) -> int:
        return self._state.queue_depth if self._alive else 0

    def healthy(self) -> bool:
        return self._alive and not self.restarting and self._state.healthy

    def restart(self) -> None:
        """Put a new actor in the dead one's place, in the background (Ray starts it once a node
        with the placement's resources is up); `healthy()` stays False until it is ready."""
        with self._lock:
            if self.restarting or self._alive:
                return
            self.restarting = True
        threading.Thread(target=self._replace, name=f"ray-{self.role}-restart", daemon=True).start()

    def _replace(self) -> None:
        import ray

        with contextlib.suppress(Exception):  # already gone with its node
            ray.kill(self._actor, no_restart=True)
        try:
            self._start_actor(RESTART_TRY_S)
            logger.warning("stage %s: a new Ray actor replaced the lost one", self.role)
        except Exception:
            logger.exception("stage %s: no new Ray actor; the next health check tries again", self.role)
        finally:
            self.restarting = False

    def stop(self) -> None:
        import ray

        with self._lock:
            actor, alive, self._alive = self._actor, self._alive, False
        if actor is None:
            return
        if alive:
            try:
                ray.get(actor.stop.remote(), timeout=STOP_TIMEOUT_S)
            except Exception:
                logger.warning("stage %s: its Ray actor did not stop cleanly", self.role)
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
