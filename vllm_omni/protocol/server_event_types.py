"""The `type` of every server event the GA lane sends (docs/realtime-api.md §5): one spelling,
shared by the server's builders (server_event_builders) and the clients that read them."""

from __future__ import annotations

# Session
SESSION_CREATED = "session.created"
SESSION_UPDATED = "session.updated"
SESSION_CLOSED = "session.closed"
SESSION_EXPIRED = "session.expired"
SESSION_RESUMED = "session.resumed"
SESSION_REPLACED = "session.replaced"
SESSION_HEARTBEAT_ACK = "session.heartbeat_ack"
ERROR = "error"
RATE_LIMITS_UPDATED = "rate_limits.updated"

# Input audio buffer
SPEECH_STARTED = "input_audio_buffer.speech_started"
SPEECH_STOPPED = "input_audio_buffer.speech_stopped"
AUDIO_BUFFER_TIMEOUT_TRIGGERED = "input_audio_buffer.timeout_triggered"
AUDIO_BUFFER_COMMITTED = "input_audio_buffer.committed"
AUDIO_BUFFER_CLEARED = "input_audio_buffer.cleared"
OVERLAP_DECISION = "overlap.decision"
RESPONSE_LISTEN = "response.listen"  # a natively duplex model listened for a unit
RESPONSE_SPEAK = "response.speak"  # it started speaking: before its response's first delta
TURN_EVENT = "turn.event"  # a duplex client's turn.signal, applied to the turn state

# Conversation items
ITEM_ADDED = "conversation.item.added"
ITEM_CREATED = "conversation.item.created"
ITEM_DONE = "conversation.item.done"
ITEM_DELETED = "conversation.item.deleted"
ITEM_RETRIEVED = "conversation.item.retrieved"
ITEM_TRUNCATED = "conversation.item.truncated"
INPUT_TRANSCRIPTION_DELTA = "conversation.item.input_audio_transcription.delta"
INPUT_TRANSCRIPTION_COMPLETED = "conversation.item.input_audio_transcription.completed"
INPUT_TRANSCRIPTION_FAILED = "conversation.item.input_audio_transcription.failed"

# Responses
RESPONSE_CREATED = "response.created"
RESPONSE_DONE = "response.done"
OUTPUT_ITEM_ADDED = "response.output_item.added"
OUTPUT_ITEM_DONE = "response.output_item.done"
CONTENT_PART_ADDED = "response.content_part.added"
CONTENT_PART_DONE = "response.content_part.done"
OUTPUT_AUDIO_DELTA = "response.output_audio.delta"
OUTPUT_AUDIO_DONE = "response.output_audio.done"
OUTPUT_AUDIO_TRANSCRIPT_DELTA = "response.output_audio_transcript.delta"
OUTPUT_AUDIO_TRANSCRIPT_DONE = "response.output_audio_transcript.done"
OUTPUT_TEXT_DELTA = "response.output_text.delta"
OUTPUT_TEXT_DONE = "response.output_text.done"
FUNCTION_CALL_ARGUMENTS_DELTA = "response.function_call_arguments.delta"
FUNCTION_CALL_ARGUMENTS_DONE = "response.function_call_arguments.done"

# Output audio and playback
OUTPUT_AUDIO_BUFFER_STARTED = "output_audio_buffer.started"  # WebRTC: the call's speaker track
OUTPUT_AUDIO_BUFFER_STOPPED = "output_audio_buffer.stopped"  # WebRTC
OUTPUT_AUDIO_BUFFER_CLEARED = "output_audio_buffer.cleared"
PLAYBACK_ACKNOWLEDGED = "playback.acknowledged"
