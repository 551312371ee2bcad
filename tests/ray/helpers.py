"""Configs, rewards and record comparisons of the Ray suite (imported by the Ray workers as ``tests.ray.helpers``)."""

from __future__ import annotations

from typing import Any

from tests.runner.helpers import tokenizer_dir


def sglang_config(urls: list[str], **rollout: Any) -> dict[str, Any]:
    """The SGLang adapter on local fake servers, with the runner suite's `add` tool."""
    return {
        "backend": "sglang",
        "tokenizer": tokenizer_dir(),
        "backend_options": {"base_url": urls, "retry": {"max_attempts": 1}},
        "rollout": {"tools": ["tests.runner.helpers:add"], "reward": "tests.runner.helpers:contains_answer", **rollout},
    }


def by_sample(sample: Any) -> float:
    """A reward that does not depend on the answer's text: 1 for odd samples."""
    return float(sample.sample % 2)


def rank(rewards: list[float | None]) -> list[float]:
    """A group reward: each rollout's rank by reward."""
    order = sorted(range(len(rewards)), key=lambda n: rewards[n] or 0.0)
    return [float(order.index(n)) for n in range(len(rewards))]


def comparable(record: Any, *, ids: bool = True) -> tuple[Any, ...]:
    """What two runs of the same seeded task must agree on (not timings; not token ids when ``ids`` is false)."""
    traj = record.trajectory
    if not ids:
        return (record.key, record.group, record.status, record.reward, record.advantage, record.tokens.model_calls,
                record.tokens.tool_calls, [s.kind for s in traj.segments], traj.status)  # fmt: skip
    return (
        record.task_id,
        record.sample,
        record.group,
        record.status,
        record.status_reason,
        record.reward,
        record.advantage,
        list(traj.token_ids),
        [(s.kind, s.start, s.end) for s in traj.segments],
        record.tokens,
    )
