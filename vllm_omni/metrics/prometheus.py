"""Prometheus metrics of the realtime server (exported at /metrics)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30)
RTF_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 4, 8)

ACTIVE_SESSIONS = Gauge("vllm_omni_realtime_active_sessions", "Open realtime sessions")
SESSIONS_TOTAL = Counter("vllm_omni_realtime_sessions_total", "Realtime sessions opened")
RESPONSES = Counter("vllm_omni_realtime_responses_total", "Responses by final status", ["status"])
ERRORS = Counter("vllm_omni_realtime_errors_total", "Error events sent, by code", ["code"])
TTFT = Histogram("vllm_omni_realtime_ttft_seconds", "Response start to first text", buckets=LATENCY_BUCKETS)
TTFP = Histogram("vllm_omni_realtime_ttfp_seconds", "Response start to first audio packet",
                 buckets=LATENCY_BUCKETS)
RTF = Histogram("vllm_omni_realtime_rtf", "Generation time over audio duration, per response",
                buckets=RTF_BUCKETS)


class _StageGaugeCollector:
    """One per-stage gauge, read from the engine at scrape time (`source`: {stage: value})."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name, self.documentation = name, documentation
        self.source: Callable[[], dict[str, int]] | None = None

    def collect(self):
        family = GaugeMetricFamily(self.name, self.documentation, labels=["stage"])
        if self.source is not None:
            for stage, value in self.source().items():
                family.add_metric([stage], value)
        yield family


STAGE_QUEUES = _StageGaugeCollector("vllm_omni_stage_queue_depth", "Messages and requests waiting per stage")
STAGE_ACTIVE_REQUESTS = _StageGaugeCollector("vllm_omni_stage_active_requests",
                                             "Requests holding state in each stage")
REGISTRY.register(STAGE_QUEUES)
REGISTRY.register(STAGE_ACTIVE_REQUESTS)

HTTP_REQUESTS = Counter("vllm_omni_http_requests_total", "HTTP generation requests by endpoint and status code",
                        ["endpoint", "status"])
HTTP_ACTIVE_REQUESTS = Gauge("vllm_omni_http_active_requests", "HTTP generation requests being answered",
                             ["endpoint"])
HTTP_TTFT = Histogram("vllm_omni_http_ttft_seconds", "HTTP request arrival to first text", ["endpoint"],
                      buckets=LATENCY_BUCKETS)
HTTP_TTFP = Histogram("vllm_omni_http_ttfp_seconds", "HTTP request arrival to first audio", ["endpoint"],
                      buckets=LATENCY_BUCKETS)
