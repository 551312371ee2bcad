"""A rollout record as an ATIF trajectory, with tito's token-level data in the fields ATIF leaves for it.

ATIF is the Agent Trajectory Interchange Format that Harbor, its viewer and NeMo Gym read.

One ATIF trajectory per rollout, its final branch (the one the record's ``turns`` describe): for each model call a
``user`` step with the call's new prompt (the first one: the whole prompt; later ones: the tool results and the
template's boundaries) and an ``agent`` step with the output. The agent step's ``metrics`` hold the call's exact
token ids (``prompt_token_ids``: the whole prompt sent, history included, as ATIF defines it;
``completion_token_ids``), the output's ``logprobs`` and, in ``metrics.extra``, the finish reason, the weight
versions and ``constrained``. The trajectory's ``extra["tito"]`` holds the record's task, sample, group, status,
reason, reward and advantage. Text is decoded with the tokenizer given; without one messages are empty (the
token ids are all there). The version written is ``ATIF-v1.7``; ``tests/harbor`` validates it with harbor's own
``Trajectory`` model.
"""

from __future__ import annotations

from typing import Any

from ..records import RolloutRecord
from ..trajectory import Trajectory

__all__ = ["ATIF_VERSION", "to_atif"]

ATIF_VERSION = "ATIF-v1.7"


def to_atif(record: RolloutRecord, tokenizer: Any = None, *, agent: str = "tito") -> dict[str, Any]:
    """``record`` as one ATIF trajectory (plain JSON data)."""
    traj = Trajectory.from_record(record.trajectory)
    ids, logprobs = traj.token_ids, traj.logprobs

    def text(start: int, end: int) -> str:
        return tokenizer.decode(ids[start:end]) if tokenizer is not None else ""

    steps: list[dict[str, Any]] = []
    for turn in traj.turns:
        out = turn.prompt_start + turn.prompt_len
        end = out + turn.output_len
        steps.append({"step_id": len(steps) + 1, "source": "user", "message": text(turn.prompt_start, out)})
        extra: dict[str, Any] = {"finish_reason": turn.finish_reason, "constrained": turn.constrained}
        metrics: dict[str, Any] = {
            "prompt_tokens": out,
            "completion_tokens": turn.output_len,
            "prompt_token_ids": ids[:out],
            "completion_token_ids": ids[out:end],
            "extra": extra,
        }
        if all(lp is not None for lp in logprobs[out:end]):  # ATIF has no "unknown" logprob
            metrics["logprobs"] = logprobs[out:end]
        if turn.weight_versions:
            extra["weight_versions"] = [[v.version, v.start, v.end] for v in turn.weight_versions]
        steps.append(
            {
                "step_id": len(steps) + 1,
                "source": "agent",
                "message": text(out, end),
                "llm_call_count": 1,
                "metrics": metrics,
            }
        )
    return {
        "schema_version": ATIF_VERSION,
        "session_id": traj.rollout_id,
        "agent": {"name": agent, "version": _version()},
        "steps": steps,
        "extra": {
            "tito": {
                "task_id": record.task_id,
                "sample": record.sample,
                "group": record.group,
                "status": record.status,
                "status_reason": record.status_reason,
                "reward": record.reward,
                "advantage": record.advantage,
                "branch": traj.branch,
                "branches": len(traj.branches),
            }
        },
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tito-core")
    except PackageNotFoundError:
        return "unknown"
