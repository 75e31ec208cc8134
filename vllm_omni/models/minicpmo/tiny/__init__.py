"""A tiny random-weight MiniCPM-o 4.5 checkpoint, built locally (docs/minicpmo.md)."""
