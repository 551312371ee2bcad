"""Rollout records as training rows: one row per training branch, in a trainer's format.

What ``tito export`` writes and ``RolloutBatches(samples=...)`` returns. Each row holds the trainer's fields
(:mod:`tito_core.export`) of one :class:`~tito_core.export.TrainingBranch`, its lineage (``rollout_id``,
``branch``, ``parent_branch``, ``shared_prefix``, ``final``, ``superseded``, ``fork_kind``, and for a compaction
``compacted_from_branch`` and ``compacted_from_turn``), the rollout's ``task_id``, ``sample``
and ``group``, and its ``reward`` and ``advantage``: by default the episode's, which the group reward function
computed over episodes (records), not branches; a branch rewarded on its own (``branch_rewards``) carries its own,
and a retried call's superseded attempt none (docs/rollouts.md, "Rewards per lineage"). Images are given by their sha256
(plain data; the bytes are the records' ``<output>.images/<sha256>.<format>`` files), in each trainer's field.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, get_args

import msgspec

from .. import export
from ..errors import ConfigError
from ..export import BranchReward, KeptSetLayout, TrainingBranch, training_branches
from ..records import RolloutRecord
from ..trajectory import Trajectory
from .staleness import is_stale

__all__ = ["ExportFormat", "GeneratedTokens", "generated_tokens", "packed_trees", "training_rows", "verl_metrics"]

ExportFormat = Literal["slime", "verl", "trl", "agl", "areal"]
"""``slime`` (``Sample`` fields), ``verl`` (``AgentLoopOutput``), ``trl`` (``rollout_func`` columns), ``agl``
(Agent Lightning v1 ``model_request`` events), ``areal`` (a row of AReaL's batch dict; :func:`packed_trees` packs
such rows into prefix trees)."""

Converter = Callable[[TrainingBranch, RolloutRecord, KeptSetLayout], dict[str, Any]]


def _slime(branch: TrainingBranch, record: RolloutRecord, kept_sets: KeptSetLayout) -> dict[str, Any]:
    fields = export.to_slime(branch, images="sha256", kept_sets=kept_sets)
    experts = fields.get("rollout_routed_experts")
    if experts is not None:
        fields["rollout_routed_experts"] = experts.tolist()  # a numpy array: rows are plain data
    return fields


def _verl(branch: TrainingBranch, record: RolloutRecord, kept_sets: KeptSetLayout) -> dict[str, Any]:
    final = branch.final
    fields = export.to_verl(
        branch,
        metrics=verl_metrics(record) if final else None,
        images="sha256",
        turn_rewards=record.turn_rewards if final else None,  # per-turn rewards are the final branch's calls'
    )
    experts = fields.get("routed_experts")
    if experts is not None:
        fields["routed_experts"] = experts.tolist()  # a numpy array: rows are plain data
    return fields


def _agl(branch: TrainingBranch, record: RolloutRecord, kept_sets: KeptSetLayout) -> dict[str, Any]:
    return {"model_request_events": export.model_request_events(branch, images="sha256")}


_CONVERTERS: dict[str, Converter] = {
    "slime": _slime,
    "verl": _verl,
    "trl": lambda branch, _, __: export.to_trl(branch, images="sha256"),
    "agl": _agl,
    "areal": lambda branch, _, __: export.to_areal(branch),
}


Baseline = Literal["rollouts", "branches"]
"""Over what a group's advantage baseline is taken when rows have rewards of their own: the group's rollouts (their
``reward``) or all its training rows (each row's reward)."""


def training_rows(
    records: Iterable[RolloutRecord],
    to: ExportFormat,
    *,
    branch_reward: BranchReward = "shared",
    current_version: str | int | None = None,
    max_staleness: int | None = None,
    reward_superseded: bool = False,
    baseline: Baseline | None = None,
    kept_sets: KeptSetLayout = "trainer",
) -> Iterator[dict[str, Any]]:
    """The training rows of ``records``, in order: one per training branch of each (see the module doc).

    With ``max_staleness``, records more than that many versions behind ``current_version`` are skipped
    (:func:`tito_core.runner.staleness.is_stale`, whatever their ``stale`` mark says).

    Each row's ``reward`` is :meth:`~tito_core.export.TrainingBranch.reward`'s: its branch's own (a record's
    ``branch_rewards``), else the rollout's; a superseded attempt's is None unless ``reward_superseded``. Its
    ``advantage`` is the record's (the group reward function's, over rollouts), None for a row without a reward.
    With ``baseline``, every row's advantage is GRPO's ``(reward - mean) / (std + 1e-6)`` instead, the mean and
    standard deviation taken over its group's rollouts (``"rollouts"``) or over all its rows (``"branches"``); the
    records are then read whole first.

    ``kept_sets`` says where the kept sets of a truncating call go: the trainer's own fields where it has them
    (slime's), else tito's layout (``"trainer"``); or tito's layout for every format (``"tito"``).

    Raises:
        ConfigError: An unknown format, ``branch_reward``, ``baseline`` or ``kept_sets``; ``max_staleness`` without
            ``current_version``.
        KeptSetLayoutError: A slime row trains a token without a kept set while another call truncated
            (:func:`~tito_core.export.to_slime`); ``kept_sets="tito"`` writes it in tito's layout.
    """
    if max_staleness is not None and current_version is None:
        raise ConfigError("max_staleness needs current_version: staleness is counted from the current version")
    if to not in get_args(ExportFormat):
        raise ConfigError(f"unknown export format {to!r}; expected one of {list(get_args(ExportFormat))}")
    if branch_reward not in get_args(BranchReward):
        raise ConfigError(f"branch_reward must be one of {list(get_args(BranchReward))}, not {branch_reward!r}")
    if baseline is not None and baseline not in get_args(Baseline):
        raise ConfigError(f"baseline must be one of {list(get_args(Baseline))}, not {baseline!r}")
    if kept_sets not in get_args(KeptSetLayout):
        raise ConfigError(f"kept_sets must be one of {list(get_args(KeptSetLayout))}, not {kept_sets!r}")
    kept = (r for r in records if not is_stale(r, current_version, max_staleness))
    if baseline is not None:
        yield from _with_baseline(list(kept), to, branch_reward, reward_superseded, baseline, kept_sets)
        return
    for record in kept:
        for fields in _rows(record, to, branch_reward, reward_superseded, kept_sets):
            if record.advantage is not None and fields["reward"] is not None:
                fields["advantage"] = record.advantage
            yield fields


def _rows(
    record: RolloutRecord,
    to: ExportFormat,
    branch_reward: BranchReward,
    reward_superseded: bool,
    kept_sets: KeptSetLayout,
) -> Iterator[dict[str, Any]]:
    """One record's rows, without their advantage."""
    convert = _CONVERTERS[to]
    traj = Trajectory.from_record(record.trajectory)
    for branch in training_branches(traj, branch_reward=branch_reward):
        fields = convert(branch, record, kept_sets)
        fields.update(branch.lineage())
        reward = branch.reward(record.reward, record.branch_rewards, superseded=reward_superseded)
        fields.update(task_id=record.task_id, sample=record.sample, group=record.group, reward=reward)
        if record.turn_rewards is not None and branch.final:
            fields["turn_rewards"] = record.turn_rewards
        yield fields


def _with_baseline(
    records: list[RolloutRecord],
    to: ExportFormat,
    branch_reward: BranchReward,
    reward_superseded: bool,
    baseline: Baseline,
    kept_sets: KeptSetLayout,
) -> Iterator[dict[str, Any]]:
    """The rows of ``records``, each with its GRPO advantage against its group's baseline."""
    rows = [
        (record, fields)
        for record in records
        for fields in _rows(record, to, branch_reward, reward_superseded, kept_sets)
    ]
    pool: dict[int, list[float]] = {}  # per group, the rewards the baseline is taken over
    if baseline == "rollouts":
        for record in records:
            if record.reward is not None:
                pool.setdefault(record.group, []).append(record.reward)
    else:
        for record, fields in rows:
            if fields["reward"] is not None:
                pool.setdefault(record.group, []).append(fields["reward"])
    for record, fields in rows:
        values = pool.get(record.group, [])
        if fields["reward"] is not None and values:
            mean = statistics.fmean(values)
            std = statistics.pstdev(values) if len(values) > 1 else 0.0
            fields["advantage"] = (fields["reward"] - mean) / (std + 1e-6)
        yield fields


def packed_trees(records: Iterable[RolloutRecord], *, max_tokens: int, **options: Any) -> list[export.PackedTree]:
    """The ``areal`` training rows of ``records`` packed into prefix trees of at most ``max_tokens`` tokens.

    As AReaL's tree training packs one batch (:func:`~tito_core.export.pack_trees`); ``options`` as
    :func:`training_rows` takes them.

    Raises:
        ConfigError: What :func:`training_rows` raises for; ``max_tokens`` not a positive multiple of 128; a row
            longer than ``max_tokens``.
    """
    try:
        return export.pack_trees(training_rows(records, "areal", **options), max_tokens=max_tokens)
    except ValueError as exc:
        raise ConfigError(f"cannot pack the rows into trees: {exc}") from exc


def verl_metrics(record: RolloutRecord) -> dict[str, float]:
    """The ``AgentLoopMetrics`` of verl from a record's timings, where they map (given to its final branch).

    The record times the whole agent loop (``agent_s``: model calls and tools together). A rollout that called
    no tool spent it in model calls (generation, with prompt rendering): ``generate_sequences = agent_s``,
    ``tool_calls = 0``. With tool calls the two cannot be told apart, and verl's defaults stay.
    """
    if record.tokens.tool_calls == 0:
        return {"generate_sequences": record.timings.agent_s, "tool_calls": 0.0}
    return {}


class GeneratedTokens(msgspec.Struct, frozen=True, kw_only=True):
    """How many tokens the model generated, over every branch and in the final branches alone.

    Attributes:
        rollouts: Records counted.
        branches: Their branches.
        all_branches: Tokens generated in any branch, each counted once (in the branch that generated it).
        final_branch: Generated tokens in the final branches (what ``branch_reward="last"`` trains).
    """

    rollouts: int
    branches: int
    all_branches: int
    final_branch: int

    @property
    def final_share(self) -> float:
        """The share of generated tokens that exporting only the final branch keeps (1.0 when nothing forked)."""
        return self.final_branch / self.all_branches if self.all_branches else 1.0


def generated_tokens(records: Iterable[RolloutRecord]) -> GeneratedTokens:
    """Count what ``records`` generated in all branches and in their final branches."""
    rollouts = branches = everything = final = 0
    for record in records:
        traj = Trajectory.from_record(record.trajectory)
        rollouts += 1
        for branch in training_branches(traj):
            everything += sum(branch.trajectory.loss_mask[branch.prompt_length :])
        branches += len(traj.all_branches)
        final += sum(traj.loss_mask)
    return GeneratedTokens(rollouts=rollouts, branches=branches, all_branches=everything, final_branch=final)
