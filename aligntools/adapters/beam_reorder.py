"""Noticing transformers' beam search, which reorders batch rows between decode steps.

Why: the Tracker pairs the logits at (request r, position p) with the token at (r, p + 1)
to derive ``logprobs`` (``aligntools.tracker.derived``). Beam search moves hypotheses
between rows every step (``Cache.reorder_cache(beam_idx)``), so a row's next token may
belong to another hypothesis and the derived logprob means nothing. The forward itself
cannot tell (decode feeds one new token per row); the cache's reorder call can.
"""

from __future__ import annotations

from typing import Callable

_WATCHED = "_aligntools_reorder_watched"


def watch_reorders(cache: object, on_reorder: Callable[[], None]) -> None:
    """Call ``on_reorder()`` whenever ``cache`` (a transformers ``Cache``) reorders its rows.

    The instance's ``reorder_cache`` is wrapped once (caches live for one ``generate``);
    objects without that method, or already watched, are left as they are.
    """
    original = getattr(cache, "reorder_cache", None)
    if original is None or getattr(cache, _WATCHED, False):
        return

    def reorder_cache(*args, **kwargs):
        on_reorder()
        return original(*args, **kwargs)

    try:
        cache.reorder_cache = reorder_cache
        setattr(cache, _WATCHED, True)
    except AttributeError:  # a cache class with __slots__: nothing to watch with
        return
