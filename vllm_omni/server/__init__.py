"""FastAPI app: /v1/realtime, /v1/models, /health, /metrics. Only I/O glue: parse, hand to a
session, write events."""
