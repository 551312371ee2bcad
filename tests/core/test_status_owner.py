"""One owner for status: every status a trajectory or record gets is :func:`tito_core.status.status_of`'s answer.

The source check reads every package's code: no status literal is written into a trajectory, a fork, a record
or a ``status`` variable outside ``status.py`` (the owner) and ``trajectory/live.py`` (whose ``close`` asks the owner).
The other tests pin the one rule for which ending replaces which status, and that a record and its trajectory
agree on every way the runner writes a failed one.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from tito_core.errors import BackendError, LoopLimitError
from tito_core.records.schema import GroupAdvantages
from tito_core.runner.dataset import Task
from tito_core.runner.finish import failed_record
from tito_core.status import (
    CallLimit,
    Discarded,
    GroupFailed,
    RolloutTimedOut,
    Stopped,
    replaces,
    status_of,
)

ROOT = Path(__file__).resolve().parents[2]
STATUSES = {"running", "completed", "truncated", "aborted", "failed"}
OWNERS = {"tito_core/status.py", "tito_core/trajectory/live.py"}
# Wire formats with a `status` field of their own (a Responses API response's and output item's), which a codec
# fills from a CallAnswer: no trajectory or record is in reach there (checked below).
WIRE = {"tito_core/gateway/fronts/responses.py"}
WRITERS = {"set_status", "amend_status", "close", "fork"}


def _literal_statuses(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in STATUSES]


def _status_writes(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in WRITERS:
                for arg in node.args[:1] if name != "fork" else []:
                    if isinstance(arg, ast.Starred):  # *status_of(...): the owner's answer (Closed is checked below)
                        continue
                    found += [(node.lineno, f"{name}({value!r})") for value in _literal_statuses(arg)]
            if name == "Closed" and node.args:
                found += [(node.lineno, f"Closed({v!r})") for v in _literal_statuses(node.args[0]) if v != "running"]
            for keyword in node.keywords:
                if keyword.arg in ("status", "status_reason") or (keyword.arg or "").endswith("_status"):
                    found += [(node.lineno, f"{name}(status={v!r})") for v in _literal_statuses(keyword.value)]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [ast.unparse(target) for target in targets]
            if any("status" in name for name in names):
                found += [(node.lineno, f"{names[0]} = {v!r}") for v in _literal_statuses(node.value)]
    return found


def test_nothing_outside_the_status_owner_sets_a_status() -> None:
    sources = sorted((ROOT / "packages").glob("*/src/**/*.py"))
    assert len(sources) > 100  # the whole tree is read, not an empty glob
    offenders = []
    for path in sources:
        relative = path.relative_to(ROOT)
        module = "/".join(path.parts[path.parts.index("src") + 1 :])
        if module in OWNERS | WIRE:
            continue
        for line, what in _status_writes(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{relative}:{line}: {what}")
    assert offenders == [], "statuses written outside tito_core.status:\n" + "\n".join(offenders)


def test_the_wire_formats_left_out_of_the_check_reach_no_trajectory() -> None:
    for module in WIRE:
        tree = ast.parse((ROOT / "packages/tito-core/src" / module).read_text())
        names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        units = {"trajectory", "records", "status", "rollout_core"}
        reached = [n for n in names if n.removeprefix("tito_core.").split(".")[0] in units]
        assert names and reached == [], f"{module} imports {reached}: it may write a trajectory's status"


def test_the_source_check_finds_each_kind_of_write() -> None:
    code = """
traj.set_status("truncated", "x")
traj.close("aborted", "y")
record = RolloutRecord(status="failed")
status: Status | None = "aborted" if discarded else None
traj.close(*status_of(Closed("aborted", reason)))
traj.close(*status_of(Closed("running", reason)))
traj.close()
if traj.status == "running":
    pass
"""
    assert [what for _, what in sorted(_status_writes(ast.parse(code)))] == [
        "set_status('truncated')",
        "close('aborted')",
        "RolloutRecord(status='failed')",
        "status = 'aborted'",
        "Closed('aborted')",
    ]


@pytest.mark.parametrize(
    ("ended", "replaced"),
    [
        (RolloutTimedOut(1.0), {"running", "completed", "aborted"}),
        (LoopLimitError("max_model_calls (3) reached"), {"running"}),
        (CallLimit(3), {"running"}),
        (BackendError("down"), {"running", "completed"}),
        (Stopped("the gateway shut down"), {"running", "completed"}),
    ],
    ids=["timeout", "loop-limit", "call-limit", "agent-error", "gateway-stop"],
)
def test_one_rule_for_which_ending_replaces_which_status(ended: object, replaced: set[str]) -> None:
    assert {status for status in STATUSES if replaces(ended, status)} == replaced  # type: ignore[arg-type]


def test_the_new_outcomes_have_a_status_and_a_reason() -> None:
    assert status_of(Stopped("idle")) == ("aborted", "idle")
    assert status_of(CallLimit(3)) == ("truncated", "stopped after 3 model calls (the front's call limit)")
    assert status_of(Discarded())[0] == "aborted"
    assert status_of(GroupFailed("group reward function raised X")) == ("failed", "group reward function raised X")


@pytest.mark.parametrize("exc", [asyncio.CancelledError(), BackendError("down")], ids=["cancelled", "error"])
def test_a_rollout_that_could_not_run_says_the_same_in_record_and_trajectory(exc: BaseException) -> None:
    record = failed_record(Task(id="t", prompt="p", index=0), 0, "s", 0.0, exc)  # type: ignore[arg-type]
    assert record.status == record.trajectory.status == status_of(exc)[0]
    assert record.status_reason == record.trajectory.status_reason == status_of(exc)[1]


def test_a_failed_group_fails_its_records_and_their_trajectories() -> None:
    record = failed_record(Task(id="t", prompt="p", index=0), 0, "s", 0.0, BackendError("down"))
    ok = GroupAdvantages(task_id="t", samples=[0], values=[None], error="group reward function raised X: y")
    failed = ok.apply(record)
    assert (failed.status, failed.status_reason) == ("failed", "group reward function raised X: y")
    assert (failed.trajectory.status, failed.trajectory.status_reason) == (failed.status, failed.status_reason)
