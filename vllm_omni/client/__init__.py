"""Reusable async realtime client, WAV I/O, timing summaries. Never imports server, session or
engine."""
