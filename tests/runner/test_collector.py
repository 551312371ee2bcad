"""The garbage collector while rollouts run (``rollout.gc``): tuned inside, the process's settings back after."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from tito_core import rollout
from tito_core.errors import ConfigError
from tito_core.runner import read_records
from tito_core.runner.collector import TUNED_THRESHOLD, collector_for_rollouts

from .helpers import answer_with, config, tasks

GC_REWARD = "tests.runner.helpers:gc_threshold"


@pytest.fixture(autouse=True)
def _process_collector() -> Iterator[None]:
    """Each test starts from the interpreter's defaults, and leaves the process as it found it."""
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    gc.enable()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)
    if not enabled:
        gc.disable()


def test_tuned_inside_the_block_and_restored_after() -> None:
    alive = [object(), {"x": []}]
    with collector_for_rollouts("tuned"):
        assert gc.get_threshold() == TUNED_THRESHOLD
        assert gc.get_freeze_count() >= len(alive)  # what was alive at the start is out of the collector's reach
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def test_garbage_alive_at_the_start_is_collected_not_frozen() -> None:
    class Node:
        pass

    node = Node()
    node.self = node  # type: ignore[attr-defined]  # a reference cycle: only the collector frees it
    gone = weakref.ref(node)
    del node
    with collector_for_rollouts("tuned"):
        assert gone() is None  # frozen, it would stay until the last user leaves


def test_restored_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), collector_for_rollouts("tuned"):
        raise RuntimeError("a rollout failed")
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0


def test_default_leaves_the_process_alone() -> None:
    gc.set_threshold(1234, 5, 6)
    with collector_for_rollouts("default"):
        assert gc.get_threshold() == (1234, 5, 6) and gc.get_freeze_count() == 0


def test_overlapping_users_share_one_tuning_until_the_last_leaves() -> None:
    first, second = collector_for_rollouts("tuned"), collector_for_rollouts("tuned")
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # not nested: the first leaves while the second still runs
    assert gc.get_threshold() == TUNED_THRESHOLD
    second.__exit__(None, None, None)
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0


def test_objects_frozen_by_someone_else_stay_frozen() -> None:
    gc.freeze()
    frozen = gc.get_freeze_count()
    with collector_for_rollouts("tuned"):
        pass
    assert gc.get_freeze_count() >= frozen > 0
    assert gc.get_threshold() == (700, 10, 10)


def test_a_process_with_the_collector_off_is_left_off() -> None:
    gc.disable()
    with collector_for_rollouts("tuned"):
        assert not gc.isenabled() and gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0
    assert not gc.isenabled()


@pytest.mark.parametrize(("mode", "seen"), [("tuned", TUNED_THRESHOLD[0]), ("default", 700)])
def test_a_run_rolls_out_under_its_gc_setting_and_restores_it(tmp_path: Path, mode: str, seen: int) -> None:
    out = tmp_path / "out.jsonl"
    chosen = {} if mode == "tuned" else {"gc": mode}  # "tuned" is the default
    rollout(config(answer_with("ok"), reward=GC_REWARD, **chosen), tasks(3), out)
    assert [r.reward for r in read_records(out)] == [float(seen)] * 3  # seen by each rollout's reward
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0


def test_an_unknown_gc_setting_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="gc"):
        rollout(config(answer_with("ok"), gc="off"), tasks(1), tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()
