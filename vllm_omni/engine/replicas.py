"""The replicas of one stage (`replicas: N` in the deploy config) behind one stage's interface.

A request is pinned to one replica of each stage at its first message there, and all its later
messages (and its drop) go to that replica: the replica holds its state. The replica is the
least loaded healthy one (fewest requests it still works on: pinned, and not yet done there),
except that requests with the same affinity key (a realtime session's id) go back to the
replica the key last used while it is healthy: a session's next turn extends its last prompt,
and only that replica's prefix cache holds it. A pin ends when the engine drops the request
(its end, however it ended); a request that is done at this stage (while later stages still
speak it) no longer loads the replica.

A replica dies alone: the engine fails the requests pinned to it (`pinned_to`) and routes new
ones to the others; the stage is unavailable only when no replica is healthy.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from vllm_omni.engine.pacing import PaceSnapshot

AFFINITY_MEMORY = 4096  # affinity keys remembered (least recently used go first)


class Replica(Protocol):
    """What the engine needs of one stage instance (`StageWorker` or `AsyncEngineStage`)."""

    max_active: int

    def start(self) -> None: ...

    def submit(self, request_id: str, message: object) -> None: ...

    def drop(self, request_id: str) -> None: ...

    def update_pace(self, snapshot: PaceSnapshot) -> None: ...

    def drop_all(self) -> None: ...

    def stop(self) -> None: ...

    def num_requests(self) -> int: ...

    def healthy(self) -> bool: ...

    def queue_depth(self) -> int: ...


class StageReplicas:
    def __init__(self, role: str, replicas: list[Replica]):
        if not replicas:
            raise ValueError(f"stage {role}: no replicas")
        self.role = role
        self.replicas = replicas
        self.max_active = sum(replica.max_active for replica in replicas)
        self._pins: dict[str, int] = {}  # request id -> replica index
        self._busy: set[str] = set()  # pinned requests not yet done at this stage
        self._affinity: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def start(self) -> None:
        for replica in self.replicas:
            replica.start()

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()

    # Routing ------------------------------------------------------------------------------

    def submit(self, request_id: str, message: object, affinity: str | None = None) -> None:
        with self._lock:
            index = self._pins.get(request_id)
            if index is None:
                index = self._pins[request_id] = self._choose(affinity)
                self._busy.add(request_id)
        self.replicas[index].submit(request_id, message)

    def _choose(self, affinity: str | None) -> int:
        preferred = self._affinity.get(affinity) if affinity is not None else None
        if preferred is None or not self.replicas[preferred].healthy():
            healthy = [i for i, replica in enumerate(self.replicas) if replica.healthy()] or \
                list(range(len(self.replicas)))  # none is: the engine fails the request
            load = self._busy_counts()
            preferred = min(healthy, key=lambda i: load[i])
        if affinity is not None:
            self._affinity[affinity] = preferred
            self._affinity.move_to_end(affinity)
            if len(self._affinity) > AFFINITY_MEMORY:
                self._affinity.popitem(last=False)
        return preferred

    def pinned_counts(self) -> list[int]:
        counts = [0] * len(self.replicas)
        for index in self._pins.values():
            counts[index] += 1
        return counts

    def _busy_counts(self) -> list[int]:
        counts = [0] * len(self.replicas)
        for request_id in self._busy:
            counts[self._pins[request_id]] += 1
        return counts

    def done(self, request_id: str) -> None:
        """The request's work at this stage is over (its `StageDone`); it stays pinned for its drop."""
        with self._lock:
            self._busy.discard(request_id)

    def drop(self, request_id: str) -> None:
        with self._lock:
            self._busy.discard(request_id)
            index = self._pins.pop(request_id, None)
        if index is not None:
            self.replicas[index].drop(request_id)

    def replica_of(self, request_id: str) -> int | None:
        with self._lock:
            return self._pins.get(request_id)

    def pinned_to(self, index: int) -> list[str]:
        """Requests whose state lives on replica `index`."""
        with self._lock:
            return [request_id for request_id, pinned in self._pins.items() if pinned == index]

    # State of the replicas ----------------------------------------------------------------

    def update_pace(self, snapshot: PaceSnapshot) -> None:
        for replica in self.replicas:
            replica.update_pace(snapshot)

    def healthy(self) -> bool:
        """Whether the stage can serve: some replica is healthy."""
        return any(replica.healthy() for replica in self.replicas)

    def dead(self) -> list[int]:
        return [i for i, replica in enumerate(self.replicas) if not replica.healthy()]

    def num_requests(self) -> int:
        return sum(replica.num_requests() for replica in self.replicas)

    def queue_depth(self) -> int:
        return sum(replica.queue_depth() for replica in self.replicas)

    def stats(self) -> list[ReplicaStats]:
        return [ReplicaStats(self.role, i, replica.healthy(), replica.num_requests(), replica.queue_depth())
                for i, replica in enumerate(self.replicas)]


@dataclass(frozen=True)
class ReplicaStats:
    """One replica of a stage, as /health and /metrics report it."""

    role: str
    replica: int
    healthy: bool
    active_requests: int  # requests holding state on it
    queue_depth: int  # messages and requests waiting on it
