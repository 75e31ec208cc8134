"""The server takes what it loaded at startup out of the garbage collector's full passes
(server/app.py `freeze_loaded_heap`): such a pass over the loaded models, tokenizer and
engine clients stopped the event loop for about 0.5 s under load, stalling every session."""

from __future__ import annotations

import gc

from tests.realtime_helpers import running_server


def test_the_loaded_heap_is_frozen_while_serving_and_released_after(tiny_loaded) -> None:
    gc.unfreeze()
    with running_server(tiny_loaded, {}):
        frozen = gc.get_freeze_count()
        assert frozen > 10_000  # the checkpoint's modules alone are thousands of objects
        gc.collect()
        # A full pass leaves them be (an unfrozen heap would read 0 here). A few frozen objects
        # may still die by reference count as the server runs, which takes them off the count.
        assert gc.get_freeze_count() > frozen * 0.99
    assert gc.get_freeze_count() == 0
