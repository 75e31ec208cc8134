"""Stop strings: the holder (engine/stop_strings.py) and the engine ending answers with them."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.engine_helpers import make_engine, run_request
from vllm_omni.engine import Message, OmniRequest, RequestError
from vllm_omni.engine.stop_strings import Released, StopStrings

SAMPLES_PER_FRAME = 1920  # 24 kHz PCM per codec frame
CODE2WAV_DELAY = 555  # samples the decoder trims: PCM of frames 0..n-1 ends n frames less this


def feed(stops: StopStrings[int], texts: list[str]) -> list[Released[int]]:
    """Token i has text texts[i], token id 100 + i and item i."""
    return [stops.add(text, (100 + i,), i) for i, text in enumerate(texts)]


# The holder --------------------------------------------------------------------------


def test_a_stop_inside_one_token_cuts_it() -> None:
    stops = StopStrings(["END"])
    steps = feed(stops, ["Hello", " wor", "ldENDing"])
    assert [s.items for s in steps] == [[0], [1], []]
    assert steps[2].text == "ld" and steps[2].token_ids == (102,) and steps[2].stopped
    assert stops.text == "Hello world" and stops.token_ids == [100, 101, 102]


def test_a_stop_spanning_tokens_releases_only_what_precedes_it() -> None:
    stops = StopStrings(["STOP"])
    steps = feed(stops, ["a", " S", "TO", "P!"])
    assert [s.items for s in steps] == [[0], [], [], []]
    assert [s.text for s in steps] == ["a", "", "", " "]
    assert steps[3].stopped and steps[3].token_ids == (101,)  # " S" gives " ", so its token is counted
    assert stops.text == "a " and stops.token_ids == [100, 101]


def test_a_stop_at_a_token_boundary_cuts_no_token() -> None:
    stops = StopStrings(["xy"])
    steps = feed(stops, ["ab", "x", "y"])
    assert steps[2].stopped and steps[2].items == [] and steps[2].text == "" and steps[2].token_ids == ()
    assert stops.text == "ab" and stops.token_ids == [100]


def test_a_prefix_that_is_not_a_stop_is_released_once_it_cannot_be_one() -> None:
    stops = StopStrings(["abc"])
    steps = feed(stops, ["x", "a", "b", "d", "ab", "x"])
    assert [s.items for s in steps] == [[0], [], [], [1, 2, 3], [], [4, 5]]
    assert [s.text for s in steps] == ["x", "", "", "abd", "", "abx"]
    assert not any(s.stopped for s in steps)
    assert stops.text == "xabdabx"


def test_a_prefix_inside_a_token_holds_that_token() -> None:
    stops = StopStrings(["<end>"])
    steps = feed(stops, ["one <e", "n", "ding"])
    assert [s.items for s in steps] == [[], [], [0, 1, 2]]  # "<end" never completed
    assert stops.text == "one <ending"


def test_the_stop_completed_first_ends_the_text() -> None:
    stops = StopStrings(["zz", "", "bc", "abcd"])  # the empty one is ignored
    steps = feed(stops, ["xa", "b", "c"])
    assert [s.items for s in steps] == [[], [], [0]]  # "xa" waits: "abcd" could start in it
    assert steps[2].stopped and steps[2].text == "xa"  # "bc" is complete before "abcd" could be
    assert stops.text == "xa" and stops.token_ids == [100]


def test_of_stops_completed_together_the_earliest_ends_the_text() -> None:
    stops = StopStrings(["bc", "abc"])
    found = stops.add("xabcd", (1,), 0)
    assert found.stopped and found.items == [] and found.text == "x" and found.token_ids == (1,)


def test_a_stop_never_found_is_flushed_at_the_end() -> None:
    stops = StopStrings(["!!"])
    steps = feed(stops, ["Hi", "!"])
    assert [s.items for s in steps] == [[0], []]
    end = stops.flush()
    assert end.items == [1] and end.text == "!" and end.token_ids == (101,) and not end.stopped
    assert stops.text == "Hi!" and stops.flush() == Released()


def test_items_without_text_wait_for_the_text_after_them() -> None:
    """An item without text (a partial character, an event that is not answer text) leaves with
    what follows it: the character it starts could begin a stop string."""
    stops = StopStrings(["é!"])
    assert stops.add("", (), "prefilled").items == []
    assert stops.add("a", (1,), "a").items == ["prefilled", "a"]
    assert stops.add("", (), "half of é").items == []
    found = stops.add("é!", (2, 3), "rest of é")
    assert found.stopped and found.items == [] and found.text == ""
    assert stops.text == "a" and stops.token_ids == [1]


def test_a_stop_in_the_first_token_releases_nothing() -> None:
    stops = StopStrings(["He"])
    assert stops.add("", (), "prefilled").items == []
    found = stops.add("Hello", (1,), "hello")
    assert found.stopped and found.items == [] and found.text == "" and found.token_ids == ()


def test_a_stop_inside_the_first_token_keeps_its_prefill_back() -> None:
    """The prefill carries the first token into the talker's prompt: it goes only with that
    token whole, so a stop inside the first token leaves nothing spoken."""
    stops = StopStrings(["llo"])
    assert stops.add("", (), "prefilled").items == []
    found = stops.add("Hello", (1,), "hello")
    assert found.stopped and found.items == [] and found.text == "He" and found.token_ids == (1,)


# The engine --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tiny_loaded):
    built = make_engine(tiny_loaded, async_chunk=True, first=4, later=25)
    yield built
    built.shutdown()


def request(stop: tuple[str, ...] = (), modalities: tuple[str, ...] = ("text", "audio")) -> OmniRequest:
    # On the tiny checkpoint this answer's speech ends by itself once its text is cut short,
    # while the whole answer speaks until the talker's token limit.
    return OmniRequest([Message("user", text="Sing me a song.")], stop=stop, modalities=modalities,
                       sampling={"thinker": {"max_tokens": 16}, "talker": {"max_tokens": 400}})


@pytest.fixture(scope="module")
def full(engine):
    return asyncio.run(run_request(engine, request()))


def token_texts(engine, token_ids: tuple[int, ...]) -> list[str]:
    return [engine.family.tokenizer.decode([t]) for t in token_ids]


def test_stop_at_a_token_boundary_ends_text_and_speech_there(engine, full) -> None:
    texts = token_texts(engine, full["final"].token_ids)
    assert "".join(texts) == full["text"]
    boundary = len("".join(texts[:len(texts) // 2]))
    stop = full["text"][boundary:boundary + 3]
    at = full["text"].find(stop)
    cut = asyncio.run(run_request(engine, request((stop,))))
    final = cut["final"]
    assert final.finish_reason == "stop" and full["final"].finish_reason == "length"
    assert cut["text"] == final.text == full["text"][:at]
    kept = len(final.token_ids)
    assert final.token_ids == full["final"].token_ids[:kept] and "".join(texts[:kept]) == final.text
    assert final.stage_metrics["thinker"].outputs == kept + 1  # the token starting the stop was generated
    assert 0 < final.audio_duration_s < full["final"].audio_duration_s
    # The talker heard the same first `kept` tokens, then the end of the text instead of more of
    # it: frames 0..kept-1 (and their audio) are the full answer's. Later frames differ, so the
    # stopped answer's PCM is not a prefix of the full one's, only up to there.
    frames = min(cut["codes"].shape[1], full["codes"].shape[1])
    differ = np.nonzero((cut["codes"][:, :frames] != full["codes"][:, :frames]).any(axis=0))[0]
    same_frames = int(differ[0]) if len(differ) else frames
    assert same_frames >= kept
    same_samples = same_frames * SAMPLES_PER_FRAME - CODE2WAV_DELAY
    assert np.array_equal(cut["pcm"][:same_samples], full["pcm"][:same_samples])


def test_stop_inside_a_token_keeps_that_tokens_text_before_it(engine, full) -> None:
    ids = full["final"].token_ids
    texts = token_texts(engine, ids)
    index = len(texts) // 2
    start = len("".join(texts[:index])) + 2  # inside token `index`, after its " t"
    stop = full["text"][start:start + 3]
    at = full["text"].find(stop)
    cut = asyncio.run(run_request(engine, request((stop,), modalities=("text",))))
    final = cut["final"]
    assert final.finish_reason == "stop" and cut["text"] == final.text == full["text"][:at]
    # token_ids: those of the kept text, the token the stop cuts included
    cut_token = next(i for i in range(len(texts)) if len("".join(texts[:i + 1])) > at)
    assert final.token_ids == ids[:cut_token + 1]
    assert len("".join(texts[:cut_token])) < at  # it was cut, not dropped


def test_stop_in_the_first_token_leaves_nothing_to_say(engine, full) -> None:
    cut = asyncio.run(run_request(engine, request((full["text"][:3],))))
    final = cut["final"]
    assert final.finish_reason == "stop" and cut["text"] == final.text == "" and final.token_ids == ()
    assert len(cut["pcm"]) == 0 and final.audio_duration_s == 0


def test_a_stop_never_found_changes_nothing(engine, full) -> None:
    assert "zz" not in full["text"] and "9 t0" not in full["text"]
    same = asyncio.run(run_request(engine, request(("zz", "9 t0"))))  # holds each token ending in 9
    assert same["text"] == same["final"].text == full["text"]
    assert same["final"].token_ids == full["final"].token_ids
    assert same["final"].finish_reason == full["final"].finish_reason
    assert same["pcm"].tobytes() == full["pcm"].tobytes()


@pytest.mark.parametrize("stop", [("a", "b", "c", "d", "e"), ("a", ""), "a", ("a", 1)])
def test_bad_stop_strings_are_refused(engine, stop) -> None:
    with pytest.raises(RequestError, match="^stop: "):
        asyncio.run(run_request(engine, request(stop)))
