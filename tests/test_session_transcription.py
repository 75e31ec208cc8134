"""Input transcription on the scripted engine: with audio.input.transcription set, each
committed user turn is transcribed by the served model in a text-only request that starts
after the answer's first audio; deltas, then exactly one completed (or failed), and the
transcript is kept in the item."""

from __future__ import annotations

from tests.ga_conformance import ga_problems
from tests.scripted_engine import ANSWER, Finish, Text, Wait, speech_appends, turn_session
from vllm_omni.engine.request import FinishReason

TRANSCRIBED_VAD = {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
    "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": {"type": "server_vad"},
    "transcription": {"model": "qwen3-omni", "language": "en"}}}}}


async def send_all(session, events: list[dict]) -> None:
    for ev in events:
        await session.handle(ev)


async def test_each_turn_of_a_vad_session_gets_one_transcript_after_its_answer_starts_speaking() -> None:
    session, engine, events = turn_session(extensions=False)
    await session.handle(TRANSCRIBED_VAD)
    for turn, words in enumerate(("What is the weather", "And tomorrow")):
        engine.script(Wait(0.05), *ANSWER)  # the answer (first audio after a short wait)
        engine.script(Text(words), Text("?"))  # its transcription
        await send_all(session, speech_appends("speech_en_single.wav", trailing_silence_s=1.0))
        await events.wait("conversation.item.input_audio_transcription.completed", turn + 1)
        await events.wait("response.done", turn + 1)
    completed = events.of("conversation.item.input_audio_transcription.completed")
    committed = [e["item_id"] for e in events.of("input_audio_buffer.committed")]
    assert [c["item_id"] for c in completed] == committed and len(committed) == 2
    assert [c["transcript"] for c in completed] == ["What is the weather?", "And tomorrow?"]
    deltas = events.of("conversation.item.input_audio_transcription.delta")
    assert [d["delta"] for d in deltas] == ["What is the weather", "?", "And tomorrow", "?"]
    first_audio = events.index(events.of("response.output_audio.delta")[0])
    assert events.index(deltas[0]) > first_audio  # the answer spoke first
    answer, transcription = engine.requests[0], engine.requests[1]
    assert answer.modalities == ("text", "audio") and transcription.modalities == ("text",)
    assert transcription.messages[-1].audio_stream is answer.messages[-1].audio_stream  # the same features
    assert "language with code en" in transcription.messages[0].text
    await session.handle({"type": "conversation.item.retrieve", "item_id": committed[0]})
    assert events.last("conversation.item.retrieved")["item"]["content"][0]["transcript"] == "What is the weather?"
    assert [p for e in events for p in ga_problems(e)] == []


async def test_a_failed_transcription_fails_only_itself() -> None:
    session, engine, events = turn_session(extensions=False)
    await session.handle(TRANSCRIBED_VAD)
    engine.script(*ANSWER)
    engine.script(Text("Wha"), Finish(FinishReason.ERROR, error="stage died", error_code="stage_unavailable"))
    await send_all(session, speech_appends("speech_en_single.wav", trailing_silence_s=1.0))
    failed = await events.wait("conversation.item.input_audio_transcription.failed")
    assert failed["error"]["message"] == "stage died" and not events.of(
        "conversation.item.input_audio_transcription.completed")
    assert (await events.wait("response.done"))["response"]["status"] == "completed"


async def test_without_transcription_no_model_transcript_is_made() -> None:
    session, engine, events = turn_session(extensions=False)
    await session.handle({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": {"type": "server_vad"}}}}})
    await send_all(session, speech_appends("speech_en_single.wav", trailing_silence_s=1.0))
    await events.wait("response.done")
    assert len(engine.requests) == 1 and not events.of("conversation.item.input_audio_transcription.completed")
    await session.close()
