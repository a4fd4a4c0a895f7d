"""Keep the garbage collector's full passes off a serving process's start-up heap.

A server that has loaded torch, transformers and a tokenizer holds millions of objects that live
as long as it does. Python's oldest-generation collection walks every tracked object, so each
one stalls the process (the event loop, every stream, the engine's step thread waiting on the
GIL) for as long as that walk takes: about 250 ms in `fairgate bench overload`, where it was
the slowest first tokens of the run. `freeze_startup_heap`, called once start-up is done,
collects what start-up left as garbage and moves everything still alive to the permanent
generation (`gc.freeze`), so later collections walk only what serving allocates.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect, then freeze every object alive now; returns how many are frozen in all."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
