"""Python's garbage collector while many rollouts share one process (``rollout.gc``).

With hundreds of rollouts on one event loop, the cyclic collector takes a large share of the process: it
collects the young generation every 700 net allocations of container objects, and each full collection
walks every live object, the tokenizer, Strands and the loaded modules included (docs/scaling.md). While
rollouts run, :func:`collector_for_rollouts` collects once, moves what is alive then out of the
collector's reach (``gc.freeze``) and collects the young generation every 10,000 allocations; the settings
in place before are restored, and the frozen objects made collectable again, when the last user leaves.
Memory held by reference cycles waits a little longer to be freed; nothing else changes.

The settings are the process's, so overlapping users (two runs on one event loop, runs on several threads)
share one tuning: the first to enter applies it, the last to leave restores it. A Ray worker actor holds it
for as long as it has a worker built. A process whose collector is switched off (``gc.disable()``) is left
as it is.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator
from typing import Final, Literal

__all__ = ["TUNED_THRESHOLD", "CollectorMode", "collector_for_rollouts"]

CollectorMode = Literal["tuned", "default"]
"""``"tuned"``: tuned while rollouts run (the default); ``"default"``: the process's settings untouched."""

TUNED_THRESHOLD: Final = (10_000, 20, 20)
"""``gc.set_threshold`` while rollouts run: young collections every 10,000 allocations instead of 700."""

_lock = threading.Lock()
_users = 0
_restore: tuple[tuple[int, int, int], bool] | None = None  # threshold before, whether to unfreeze after


@contextlib.contextmanager
def collector_for_rollouts(mode: CollectorMode) -> Iterator[None]:
    """Tune the garbage collector for many rollouts while the block runs (``mode="tuned"``), then restore it."""
    if mode != "tuned":
        yield
        return
    _enter()
    try:
        yield
    finally:
        _leave()


def _enter() -> None:
    global _users, _restore
    with _lock:
        _users += 1
        if _users > 1 or not gc.isenabled():
            return
        # objects someone else froze stay frozen: unfreezing is all-or-nothing
        _restore = (gc.get_threshold(), gc.get_freeze_count() == 0)
        gc.collect()  # garbage alive now would be frozen too, out of reach until the last user leaves
        gc.freeze()
        gc.set_threshold(*TUNED_THRESHOLD)


def _leave() -> None:
    global _users, _restore
    with _lock:
        _users -= 1
        if _users or _restore is None:
            return
        (threshold, unfreeze), _restore = _restore, None
        gc.set_threshold(*threshold)
        if unfreeze:
            gc.unfreeze()  # what was alive at the start is collectable again (the run's own cycles included)
