"""Prometheus metrics of the realtime server (exported at /metrics).

With several API frontends (`--api-server-count N`) each frontend process writes its values
to the folder named by PROMETHEUS_MULTIPROC_DIR (prometheus_client's multiprocess mode), and
any frontend's /metrics reports the sum over all of them; gauges of live things count only
live processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from vllm_omni.engine.replicas import ReplicaStats

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30)
RTF_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 4, 8)

ACTIVE_SESSIONS = Gauge("vllm_omni_realtime_active_sessions", "Open realtime sessions", multiprocess_mode="livesum")
SESSIONS_TOTAL = Counter("vllm_omni_realtime_sessions_total", "Realtime sessions opened")
RESPONSES = Counter("vllm_omni_realtime_responses_total", "Responses by final status", ["status"])
ERRORS = Counter("vllm_omni_realtime_errors_total", "Error events sent, by code", ["code"])
TTFT = Histogram("vllm_omni_realtime_ttft_seconds", "Response start to first text", buckets=LATENCY_BUCKETS)
TTFP = Histogram("vllm_omni_realtime_ttfp_seconds", "Response start to first audio packet",
                 buckets=LATENCY_BUCKETS)
RTF = Histogram("vllm_omni_realtime_rtf", "Generation time over audio duration, per response",
                buckets=RTF_BUCKETS)


class _StageReplicaCollector:
    """Per-replica gauges of every stage, read from the engine at scrape time (`source`)."""

    def __init__(self) -> None:
        self.source: Callable[[], list[ReplicaStats]] | None = None

    def collect(self):
        labels = ["stage", "replica"]
        queued = GaugeMetricFamily("vllm_omni_stage_queue_depth", "Messages and requests waiting per stage replica",
                                   labels=labels)
        active = GaugeMetricFamily("vllm_omni_stage_active_requests", "Requests holding state in each stage replica",
                                   labels=labels)
        up = GaugeMetricFamily("vllm_omni_stage_replica_up", "1 while a stage replica is healthy", labels=labels)
        for stats in self.source() if self.source is not None else ():
            names = [stats.role, str(stats.replica)]
            queued.add_metric(names, stats.queue_depth)
            active.add_metric(names, stats.active_requests)
            up.add_metric(names, int(stats.healthy))
        yield from (queued, active, up)


STAGE_REPLICAS = _StageReplicaCollector()
REGISTRY.register(STAGE_REPLICAS)

HTTP_REQUESTS = Counter("vllm_omni_http_requests_total", "HTTP generation requests by endpoint and status code",
                        ["endpoint", "status"])
HTTP_ACTIVE_REQUESTS = Gauge("vllm_omni_http_active_requests", "HTTP generation requests being answered",
                             ["endpoint"], multiprocess_mode="livesum")
HTTP_TTFT = Histogram("vllm_omni_http_ttft_seconds", "HTTP request arrival to first text", ["endpoint"],
                      buckets=LATENCY_BUCKETS)
HTTP_TTFP = Histogram("vllm_omni_http_ttfp_seconds", "HTTP request arrival to first audio", ["endpoint"],
                      buckets=LATENCY_BUCKETS)


def exposition() -> bytes:
    """The /metrics body: this process's metrics, or every frontend's in multiprocess mode
    (the stage replicas come from the engine either way)."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return generate_latest()
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    registry.register(STAGE_REPLICAS)
    return generate_latest(registry)
