"""Prefix caching on the vLLM thinker, without an engine: the worker's store of prompt rows
(row_store.py), the capture that fills a request's rows from its forward and from the store
(capture.py), and the driver's rerun when a row the talker reads was not kept (thinker.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import torch

from vllm_omni.models.qwen3_omni.vllm_backend.capture import RowCapture
from vllm_omni.models.qwen3_omni.vllm_backend.row_channel import REPORT_ROWS_KEY
from vllm_omni.models.qwen3_omni.vllm_backend.row_store import MmItem, PromptKey, PromptRowStore
from vllm_omni.models.qwen3_omni.vllm_backend.thinker import rows_the_talker_reads

H = 4


def feature(identifier: str, offset: int, length: int) -> SimpleNamespace:
    """What the store reads of vLLM's `MultiModalFeatureSpec`."""
    return SimpleNamespace(identifier=identifier, mm_position=SimpleNamespace(offset=offset, length=length))


def rows_of(key: PromptKey) -> torch.Tensor:
    """Rows [P, 2, H] that depend on the prefix only, as a causal model's do."""
    values = torch.tensor(key.token_ids, dtype=torch.float32).cumsum(0)
    return values[:, None, None].expand(-1, 2, H).clone()


def captured(key: PromptKey, store: PromptRowStore, cached: int, chunk: int = 3) -> torch.Tensor:
    """A request's rows as the worker builds them: [0, cached) skipped by the forward."""
    capture, full = RowCapture(key), rows_of(key)
    for start in range(cached, len(key), chunk):
        capture.add(start, full[start:start + chunk], store)
    capture.add(len(key), full[-1:], store)  # a decode step: nothing to keep
    assert capture.filled == len(key) and capture.filed
    return capture.rows


def test_shared_prefix_needs_equal_ids_and_equal_items() -> None:
    a = PromptKey.of([1, 2, 9, 9, 9, 3, 4], [feature("clip-a", 2, 3)])
    assert a.shared_prefix(PromptKey.of([1, 2, 9, 9, 9, 3, 5], [feature("clip-a", 2, 3)]), 7) == 6
    assert a.shared_prefix(PromptKey.of([1, 2, 9, 9, 9, 3, 4], [feature("clip-b", 2, 3)]), 7) == 2
    assert a.shared_prefix(PromptKey.of([1, 2, 9, 9, 9, 3, 4, 8], [feature("clip-a", 2, 3),
                                                                   feature("clip-c", 7, 1)]), 8) == 7
    assert a.shared_prefix(a, 4) == 4
    assert a.mm_items == (MmItem("clip-a", 2, 3),)


def test_cached_positions_get_the_rows_of_the_prompt_that_computed_them() -> None:
    store = PromptRowStore(capacity=100)
    turn1 = PromptKey.of([1, 2, 9, 9, 3, 4], [feature("clip-a", 2, 2)])
    assert torch.equal(captured(turn1, store, cached=0), rows_of(turn1))
    # turn 2: turn 1's prompt, its answer (cached by vLLM from the decode: no kept rows), a new user turn
    turn2 = PromptKey.of([1, 2, 9, 9, 3, 4, 7, 7, 5, 6], [feature("clip-a", 2, 2)])
    rows = captured(turn2, store, cached=8)
    assert torch.equal(rows[:6], rows_of(turn2)[:6]) and torch.equal(rows[8:], rows_of(turn2)[8:])
    assert rows[6:8].isnan().all()  # the answer's rows: unknown
    assert len(store) == 1  # turn 2 extends turn 1 with the same rows: turn 1 is dropped
    # the same start with another clip shares only what lies before the clip
    other = PromptKey.of([1, 2, 9, 9, 3, 4], [feature("clip-b", 2, 2)])
    rows = captured(other, store, cached=4)
    assert torch.equal(rows[:2], rows_of(other)[:2]) and rows[2:4].isnan().all()


def test_the_store_keeps_at_most_its_capacity_least_recently_used_first() -> None:
    store = PromptRowStore(capacity=10)
    first, second, third = (PromptKey.of([n] * 4, []) for n in (1, 2, 3))
    for key in (first, second):
        store.file(key, rows_of(key))
    assert store.lookup(first, 4)[0] == 4  # first is now the more recently used
    store.file(third, rows_of(third))
    assert store.rows == 8 and store.lookup(second, 4) == (0, None)
    store.file(PromptKey.of([5] * 11, []), torch.zeros(11, 2, H))  # larger than the store: not kept
    assert store.rows == 8 and PromptRowStore(capacity=0).lookup(first, 4) == (0, None)


def test_the_talker_reads_user_segments_and_the_last_assistant_segment() -> None:
    im_start, im_end, user, assistant, system, nl = 100, 101, 102, 103, 104, 10
    ids = [im_start, system, nl, 1, im_end, nl,
           im_start, user, nl, 2, im_end, nl,
           im_start, assistant, nl, 3, im_end, nl,
           im_start, user, nl, 4, im_end, nl,
           im_start, assistant, nl]
    read = rows_the_talker_reads(ids, im_start, user, assistant)
    expected = [False] * 6 + [True] * 6 + [False] * 6 + [True] * 6 + [True] * 3
    assert read.tolist() == expected


class FakeThinkerEngine:
    """What the driver uses of AsyncLLM: each request samples one token, then EOS; the rows
    the worker pushes (`deliver`) for a request that asks for them are `rows`, one tensor per
    request, in order, ahead of the request's first output."""

    errored = False

    def __init__(self, rows: list[torch.Tensor], eos: int, deliver):
        self.rows, self.eos, self.deliver = rows, eos, deliver
        self.prompts: list[dict] = []
        self.request_ids: list[str] = []
        self.calls: list[str] = []

    async def generate(self, prompt, sampling, request_id):
        self.prompts.append(prompt)
        self.request_ids.append(request_id)
        if (sampling.extra_args or {}).get(REPORT_ROWS_KEY):
            self.deliver(request_id, self.rows.pop(0))
        for token, finished in ((7, False), (self.eos, True)):
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[token], finish_reason="stop")],
                                  num_cached_tokens=0, finished=finished)

    async def collective_rpc(self, method, args=()):
        self.calls.append(method)
        return [None]


def run_thinker(tiny_loaded, rows: list[torch.Tensor]) -> tuple[FakeThinkerEngine, list, list]:
    from vllm_omni.config import SamplingParams, StageConfig
    from vllm_omni.models.qwen3_omni.messages import ThinkerJob, ThinkerPrefilled
    from vllm_omni.models.qwen3_omni.prompt import ThinkerPrompt
    from vllm_omni.models.qwen3_omni.vllm_backend.thinker import VllmThinkerDriver

    driver = VllmThinkerDriver(tiny_loaded, StageConfig(stage_id=0, role="thinker", backend="vllm"))
    driver.engine = FakeThinkerEngine(rows, driver.eos_token_id, driver.row_receiver.deliver)
    job = ThinkerJob(ThinkerPrompt(input_ids=prompt_ids(tiny_loaded.config), audio_features=[]), SamplingParams(),
                     report_prefill=True)
    emitted: list = []
    asyncio.run(driver.run("req", job, emitted.append))
    return driver.engine, [event for event in emitted if isinstance(event, ThinkerPrefilled)], emitted


def prompt_ids(config) -> list[int]:
    """system, user, an earlier answer, user, the generation prompt."""
    start, end, nl = config.im_start_token_id, config.im_end_token_id, 198
    return ([start, 9, nl, 11, end, nl, start, config.user_token_id, nl, 12, end, nl,
             start, config.assistant_token_id, nl, 13, end, nl, start, config.user_token_id, nl, 14, end, nl,
             start, config.assistant_token_id, nl])


def test_a_row_the_talker_reads_missing_from_the_store_is_taken_from_an_uncached_prefill(tiny_loaded) -> None:
    from vllm_omni.engine.stage_api import TextToken
    from vllm_omni.models.qwen3_omni.messages import ThinkerPrefilled

    length, hidden = len(prompt_ids(tiny_loaded.config)), tiny_loaded.config.thinker_config.text_config.hidden_size
    full = torch.randn(length, 2, hidden)
    unread_missing = full.clone()
    unread_missing[:6] = float("nan")  # the system segment
    unread_missing[12:18] = float("nan")  # the earlier answer
    engine, prefilled, emitted = run_thinker(tiny_loaded, [unread_missing])
    assert len(engine.prompts) == 1 and len(prefilled) == 1
    # The first token goes out before the rows are taken: the text does not wait for them.
    assert [type(event) for event in emitted[:2]] == [TextToken, ThinkerPrefilled]
    assert torch.equal(prefilled[0].prefill.embeddings[6:12], full[6:12, 0])

    read_missing = full.clone()
    read_missing[8] = float("nan")  # in a user segment
    engine, prefilled, emitted = run_thinker(tiny_loaded, [read_missing, full])
    assert len(engine.prompts) == 2 and len(prefilled) == 1
    assert [event.token_id for event in emitted if isinstance(event, TextToken)] == [7, engine.eos]  # text once
    assert "cache_salt" not in engine.prompts[0] and engine.prompts[1]["cache_salt"]  # no cached block matches
    assert engine.request_ids == ["req", "req-rows"]  # the rows' prefill runs beside the request
    assert engine.calls == ["omni_forget", "omni_forget"]  # the rows came by the row channel, not by RPC
    assert not engine.rows  # each request that asked for rows got them
    assert torch.equal(prefilled[0].prefill.accept_hidden, full[:, 1])


def test_rows_cross_the_channel_for_open_requests_only() -> None:
    import os

    from vllm_omni.models.qwen3_omni.vllm_backend.row_channel import RowReceiver, RowSender, new_row_address

    async def scenario():
        receiver = RowReceiver(new_row_address())
        receiver.start()
        try:
            mailbox = receiver.open("a")
            sender = RowSender(receiver.address)
            sent = torch.randn(5, 2, H)
            sent[1] = float("nan")  # rows neither the forward nor the store had travel as they are
            sender.send("gone", torch.ones(1, 2, H))  # not open: dropped
            sender.send("a", torch.full((1, 2, H), 7.0), position=6)  # an answer row, ahead of the prompt's
            sender.send("a", sent)
            got = await mailbox.take(0, 5)
            assert torch.equal(got[~got.isnan()], sent[~sent.isnan()]) and got.isnan().sum() == 2 * H
            assert torch.equal(await mailbox.take(6, 5), torch.full((1, 2, H), 7.0))
            gone = receiver.open("gone")
            try:
                await gone.take(0, 0.05)
                raise AssertionError("rows of a request that was not open were kept")
            except asyncio.TimeoutError:
                pass
            receiver.close_request("gone")
            receiver.close_request("a")
        finally:
            receiver.close()
        assert not os.path.exists(receiver.address.removeprefix("ipc://"))

    asyncio.run(scenario())


def test_a_complete_capture_is_taken_once_and_only_if_its_request_asked() -> None:
    from vllm_omni.models.qwen3_omni.vllm_backend.capture import CaptureRunnerMixin

    store = PromptRowStore(capacity=100)
    runner = CaptureRunnerMixin()
    keys = {name: PromptKey.of([n, n + 1, n + 2], []) for n, name in ((1, "asked-abcdefgh"), (5, "quiet-abcdefgh"),
                                                                        (9, "partial-abcdefgh"))}
    runner._omni_captures = {name: RowCapture(key, report=not name.startswith("quiet")) for name, key in keys.items()}
    for name, key in keys.items():
        end = 2 if name.startswith("partial") else 3
        runner._omni_captures[name].add(0, rows_of(key)[:end], store)
    taken = runner.omni_take_outgoing()
    assert [(request_id, position) for request_id, position, _ in taken] == [("asked", 0)]
    assert torch.equal(taken[0][2], rows_of(keys["asked-abcdefgh"]))
    assert list(runner._omni_captures) == ["partial-abcdefgh"]  # still in its prefill
    assert runner.omni_take_outgoing() == []


def test_an_answer_is_followed_row_by_row_and_kept_for_the_next_turn() -> None:
    """Qwen2.5-Omni's capture (`follows`): each fed answer token's row goes out once, in order,
    also when a preempted request recomputes positions; when the request is forgotten, its
    prompt and fed answer are kept, so the next turn's cached positions have their rows."""
    from vllm_omni.models.qwen3_omni.vllm_backend.capture import CaptureRunnerMixin

    store = PromptRowStore(capacity=100)
    runner = CaptureRunnerMixin()
    runner._omni_store = store
    prompt = PromptKey.of([1, 2, 3, 4], [])
    answer = [5, 6, 7]  # fed tokens (the last generated token, never fed, has no row)
    conversation = PromptKey.of([1, 2, 3, 4, *answer, 8, 9], [])
    full = rows_of(conversation)
    capture = RowCapture(prompt, report=True, follows=True)
    runner._omni_captures = {"turn1-abcdefgh": capture}
    ids = torch.tensor(conversation.token_ids)
    capture.add(0, full[:4], store, ids[:4])  # the prefill
    capture.add(4, full[4:5], store, ids[4:5])  # answer token 0 fed
    sent = runner.omni_take_outgoing()
    assert [(position, len(rows)) for _, position, rows in sent] == [(0, 4), (4, 1)]
    capture.add(0, full[:6], store, ids[:6])  # preempted and recomputed up to answer token 1
    capture.add(6, full[6:7], store, ids[6:7])
    assert [(position, len(rows)) for _, position, rows in runner.omni_take_outgoing()] == [(5, 1), (6, 1)]
    runner.omni_forget("turn1")
    assert runner.omni_held_requests() == 0
    shared, kept = store.lookup(conversation, 8)
    assert shared == 7 and torch.equal(kept, full[:7])  # the next turn finds prompt and answer rows
