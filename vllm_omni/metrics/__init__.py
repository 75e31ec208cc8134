"""TTFT / TTFP / RTF per response, per-stage timings, Prometheus export."""
