"""Benchmarks that ship with the CLI (`vllm-omni bench ...`). A client of servers: never
imports the server, session or engine layers."""
