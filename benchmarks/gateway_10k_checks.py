"""The checks of ``gateway_10k.py``: what the rollout file must hold after faults, a lost worker and a weight update.

Each function returns its problems (one line each, naming the rollout and what is wrong); none: it holds. They read
the records, the fake engine's log (``fake_sglang.py``'s ``GET /log``: per generation its rid, what it did, the
prompt's SHA-1, the turn, the weight version; the pauses, resumes and relabels at their place) and what the clients
saw (``gateway_client.py``'s ``tasks``: per rollout its worker and outcome, per 200 answer when it was sent and
answered, its output's digest, branch and turn).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from gateway import check_records
from gateway_client import output_digest

LOST = "gateway worker lost"
"""The start of the reason of a rollout a lost worker's journal ended (``tito_core.gateway.workers.LOST``)."""


@dataclass(frozen=True)
class Call:
    """One call the client got a 200 for."""

    sent: float
    answered: float
    digest: str
    branch: int
    turn: int


@dataclass(frozen=True)
class Seen:
    """One rollout as its client saw it."""

    task: str
    rollout: str
    worker: str
    outcome: str  # finished, error <status>, open <why>, lost <why>, lost at finish <why>
    ended: float
    calls: tuple[Call, ...]

    @classmethod
    def parse(cls, raw: list[Any]) -> Seen:
        """From the ``tasks`` command's row."""
        task, rollout, worker, outcome, ended, calls = raw
        return cls(task, rollout, worker, outcome, ended, tuple(Call(*c) for c in calls))


@dataclass(frozen=True)
class Update:
    """When the driver's ``weight_update`` happened (``time.monotonic()``), and the labels."""

    old: str
    new: str
    pause_sent: float  # before the pause was sent: a call answered before it was generated before the pause
    resumed: float  # after the resume was answered: a call sent after it is generated under ``new``


def _turns(record: Any) -> Iterator[tuple[Any, Any]]:
    traj = record.trajectory
    for branch in [traj, *traj.branches]:
        for turn in branch.turns:
            yield branch, turn


def one_record_per_task(records: list[Any], seen: dict[str, Seen]) -> list[str]:
    """Each rollout of this pass has exactly one record, sample 0 (nothing written twice).

    Even one whose opening the door could not answer: its worker died with the request, and the door either opened
    it on another worker (the journal never had it) or answered a 502 once its record was written from the journal.
    """
    problems: list[str] = []
    by_task: dict[str, list[Any]] = defaultdict(list)
    for record in records:
        by_task[record.task_id].append(record)
    for task, rows in by_task.items():
        if task not in seen:
            problems.append(f"{task}: a record of a rollout this run did not open")
        elif len(rows) > 1:
            problems.append(f"{task}: {len(rows)} records (samples {[r.sample for r in rows]}): written twice")
        elif rows[0].sample != 0:
            problems.append(f"{task}: its one record is sample {rows[0].sample}, not 0")
    for task, rollout in seen.items():
        if task not in by_task:
            problems.append(f"{task}: no record (the client saw: {rollout.outcome})")
    return problems


def outputs_are_clean_answers(records: list[Any], log: dict[str, Any]) -> list[str]:
    """Every recorded output is one clean engine answer to the very prompt recorded before it (``gateway.py``'s)."""
    return check_records(records, log["log"], log["answers"])


def outcomes_match(records: list[Any], seen: dict[str, Seen], victim: str) -> list[str]:
    """What each client saw is what its record says; every 200 answer's ids are its turn's in the record.

    A rollout answered to its end is ``completed``; one that got an error answer is not; one whose worker was lost
    under a call is ``failed`` ("gateway worker lost", or the engine error the worker journaled just before it died,
    unanswered) and was on the killed worker; no rollout that was not is. One lost at its finish (every call
    answered) is ``completed`` (the supervisor wrote the record before the worker died, unanswered) or lost.
    """
    problems: list[str] = []
    by_task = {record.task_id: record for record in records}
    for task, rollout in seen.items():
        record = by_task.get(task)
        if record is None:
            continue  # one_record_per_task says whether that is right
        reason = record.status_reason or ""
        lost = record.status == "failed" and reason.startswith(LOST)
        under_call = rollout.outcome.startswith("lost") and not rollout.outcome.startswith("lost at finish")
        if rollout.outcome == "finished" and record.status != "completed":
            problems.append(f"{task}: answered to its end, recorded {record.status} ({reason})")
        elif rollout.outcome.startswith("error") and record.status == "completed":
            problems.append(f"{task}: the client got {rollout.outcome}, the record says completed")
        elif rollout.outcome.startswith("lost at finish") and not (lost or record.status == "completed"):
            problems.append(f"{task}: its worker was lost at its finish, recorded {record.status} ({reason})")
        elif under_call and record.status != "failed":  # "gateway worker lost", or the call's own error
            problems.append(f"{task}: its worker was lost under a call, recorded {record.status} ({reason})")
        if lost and not rollout.outcome.startswith(("lost", "open")):
            problems.append(f"{task}: recorded lost ({reason}) but its client saw {rollout.outcome}")
        if (lost or rollout.outcome.startswith("lost")) and rollout.worker not in ("", victim):
            problems.append(f"{task}: lost on {rollout.worker}, which was not killed ({victim} was)")
        turns = {(branch.branch, turn.index): (branch, turn) for branch, turn in _turns(record)}
        for call in rollout.calls:
            found = turns.get((call.branch, call.turn))
            if found is None:
                problems.append(f"{task}: answered 200 (branch {call.branch} turn {call.turn}), not in its record")
                continue
            branch, turn = found
            ids = branch.token_ids[turn.output_start : turn.output_start + turn.output_len]
            if output_digest(ids) != call.digest:
                problems.append(f"{task}: branch {call.branch} turn {call.turn}: recorded ids differ from the 200's")
    return problems


def versions_match(
    records: list[Any], log: dict[str, Any], seen: dict[str, Seen], update: Update | None
) -> tuple[list[str], dict[str, int]]:
    """Weight versions are consistent with when the update happened.

    Every recorded turn is labelled with the one version the engine generated its answer under; the engine served
    ``new`` only after the relabel; a call the client had answered before the pause was sent is labelled ``old``,
    one it sent after the resume was answered ``new``. Returns the problems and the counts of calls before, during
    and after the update.
    """
    problems: list[str] = []
    at: dict[str, str] = {}
    for (rid, kind, _digest, _turn), version in zip(log["log"], log["versions"], strict=True):
        if kind == "ok":
            at[rid] = version
    relabels = [index for kind, _value, index in log["events"] if kind == "version"]
    if update is not None:
        first_new = relabels[0] if relabels else len(log["log"])
        early = Counter(v for v in log["versions"][:first_new] if v != update.old)
        late = Counter(v for v in log["versions"][first_new:] if v != update.new)
        if early or late:
            problems.append(f"the engine served other versions than {update.old!r} then {update.new!r}: "
                            f"{dict(early)} before the relabel, {dict(late)} after")  # fmt: skip
    labels: dict[tuple[str, int, int], str] = {}
    for record in records:
        for branch, turn in _turns(record):
            spans = turn.weight_versions or ()
            where = f"{record.task_id} branch {branch.branch} turn {turn.index}"
            versions = {str(span.version) for span in spans}
            covered = sum(span.end - span.start for span in spans)
            if len(versions) != 1 or covered != turn.output_len:
                problems.append(f"{where}: weight versions {spans!r} do not label its {turn.output_len} output tokens")
                continue
            (version,) = versions
            served = at.get(turn.rid)
            if served is not None and version != served:
                problems.append(f"{where}: labelled {version!r}, the engine generated it under {served!r}")
            labels[(record.trajectory.rollout_id, branch.branch, turn.index)] = version
    counts = {"before": 0, "during": 0, "after": 0}
    if update is None:
        return problems, counts
    for rollout in seen.values():
        for call in rollout.calls:
            label = labels.get((rollout.rollout, call.branch, call.turn))
            if call.answered < update.pause_sent:
                counts["before"] += 1
                want = update.old
            elif call.sent > update.resumed:
                counts["after"] += 1
                want = update.new
            else:
                counts["during"] += 1
                continue
            if label is not None and label != want:
                problems.append(f"{rollout.task} turn {call.turn}: labelled {label!r}, expected {want!r} (sent "
                                f"{call.sent:.3f}, answered {call.answered:.3f}; update {update.pause_sent:.3f} to "
                                f"{update.resumed:.3f})")  # fmt: skip
    if not counts["before"] or not counts["after"]:
        problems.append(f"the weight update was not mid-run: {counts['before']} calls answered before it, "
                        f"{counts['after']} sent after it")  # fmt: skip
    return problems, counts


def unique_keys(records: Iterable[Any]) -> list[str]:
    """No ``(task_id, sample)`` twice in the file."""
    counts = Counter((record.task_id, record.sample) for record in records)
    return [f"{task}/{sample}: {n} records" for (task, sample), n in sorted(counts.items()) if n > 1]
