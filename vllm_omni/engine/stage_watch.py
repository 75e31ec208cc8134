"""The stages' health, checked by a thread of its own every HEALTH_POLL_S.

A request waiting on a dead engine may never hear of it (an RPC to a dead vLLM engine never
returns), so the watcher fails requests itself: those pinned to a replica that died, and
every in-flight request while some stage has no replica alive (wherever a request is in the
pipeline, it may be about to need that stage). Then it frees what the dead replica still
holds and, for a vLLM stage with `restart_on_failure`, starts a new engine in its place.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from vllm_omni.config import DeployConfig
from vllm_omni.engine.backends.async_stage import AsyncEngineStage
from vllm_omni.engine.backends.ray_stage import RayStageReplica
from vllm_omni.engine.graph import replica_name, stage_name
from vllm_omni.engine.replicas import StageReplicas

logger = logging.getLogger(__name__)

HEALTH_POLL_S = 0.25

FailRequests = Callable[[list[str] | None, str], None]  # (request ids, None: all in flight; the error)


class StageWatcher:
    def __init__(self, deploy: DeployConfig, stages: dict[str, StageReplicas], fail_requests: FailRequests):
        self.deploy, self.stages, self.fail_requests = deploy, stages, fail_requests
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stage-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    def _run(self) -> None:
        known_dead: list[str] = []
        while not self._stopping.wait(HEALTH_POLL_S):
            dead = [(role, index) for role, stage in self.stages.items() for index in stage.dead()]
            names = [replica_name(self.deploy, role, index) for role, index in dead]
            if names != known_dead:
                logger.warning("unavailable stages: %s", ", ".join(names) or "none")
                known_dead = names
            down = [role for role, stage in self.stages.items() if not stage.healthy()]
            if down:
                self.fail_requests(None, f"stage {', '.join(stage_name(self.deploy, role) for role in down)} died")
            for (role, index), name in zip(dead, names, strict=True):
                self.fail_requests(self.stages[role].pinned_to(index), f"stage {name} died")
                self._release(role, index)

    def _release(self, role: str, index: int) -> None:
        """Free what the dead replica still holds, then restart it if the deploy says so."""
        replica = self.stages[role].replicas[index]
        replica.drop_all()
        restartable = isinstance(replica, AsyncEngineStage | RayStageReplica)
        if restartable and self.deploy.stage_by_role(role).restart_on_failure:
            replica.restart()
