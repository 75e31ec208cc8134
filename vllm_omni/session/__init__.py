"""Realtime sessions: input buffer and media clock, turn detection, conversation items,
responses, barge-in. Knows the engine only through its async interface; never imports
server or models."""
