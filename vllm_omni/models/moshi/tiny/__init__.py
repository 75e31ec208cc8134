"""A tiny random-weight Moshi checkpoint, built locally (docs/moshi.md, "Tiny checkpoint")."""
