"""The mismatch ledger: the logprobs a rollout file recorded against an independent re-score of the same tokens.

For every trained token (loss mask 1) of every branch of every record (a token a forked branch copied from its
parent counts once, in the parent), ``r = new - old``: ``old`` the logprob the
engine recorded when it sampled the token, ``new`` the scorer's (a teacher-forced forward pass with the weights
the trainer has: Hugging Face transformers through tito-transformers, or the engine's own score route). The
ledger reports, over all tokens and broken down by turn index, branch, weight version, engine, finish reason,
constrained vs free turns and turns with vs without images:

- mean and max ``|r|`` (nats);
- the k3 estimate of KL(behaviour || trainer), the mean of ``exp(r) - 1 - r`` over tokens the behaviour policy
  sampled (unbiased, never negative);
- quantiles p1 / p50 / p99 of the importance ratio ``exp(r)``, the factor an importance-sampling correction
  (TIS, verl's rollout correction) multiplies each token's loss by.

A constrained turn (a forced tool call) recorded the engine's post-constraint logprobs, which a plain forward pass
does not reproduce: those turns are reported apart, and ``free`` (the unconstrained turns) is what a gate checks.
A text-only scorer cannot score tokens that follow an image (their context holds pixels it does not see): they are
counted as skipped, not scored.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import msgspec

from ..backend import Backend
from ..errors import ConfigError
from ..records import RolloutRecord
from ..trajectory import Trajectory

__all__ = [
    "AXES",
    "AuditReport",
    "BackendScorer",
    "GapStats",
    "Ledger",
    "Scorer",
    "TransformersScorer",
    "audit",
    "gap_stats",
]

AXES = ("turn", "branch", "weight_version", "server", "finish_reason", "constrained", "images")
"""The breakdowns of a report, each a key of :attr:`AuditReport.by`."""


class Scorer(Protocol):
    """Scores a token sequence with the weights under audit."""

    description: str
    """What scores (a model directory and dtype, an engine URL): the report names it."""

    takes_images: bool
    """Whether :meth:`score` sees the images of a sequence; a text-only scorer skips tokens after an image."""

    async def score(self, token_ids: Sequence[int]) -> list[float | None]:
        """``log p(token_ids[i] | token_ids[:i])`` for every position (None at 0 and where there is none)."""
        ...


class TransformersScorer:
    """A teacher-forced forward pass of a Hugging Face model (tito-transformers), float32 logits.

    Args:
        model_path: A local model directory.
        dtype: The weights' dtype (``float32`` by default, as a CPU trainer computes).
        num_threads: torch threads.
    """

    takes_images = False

    def __init__(self, model_path: str | os.PathLike[str], *, dtype: str = "float32", num_threads: int = 1) -> None:
        try:
            from tito_transformers.scoring import load_model
        except ImportError as exc:
            raise ConfigError(
                'scoring with a model directory needs tito-transformers: pip install "tito-core[transformers]" '
                f"(or score with the engine: --config) ({exc})"
            ) from exc
        self.model = load_model(str(model_path), dtype=dtype, num_threads=num_threads)
        self.description = f"transformers forward pass of {model_path} ({dtype})"

    async def score(self, token_ids: Sequence[int]) -> list[float | None]:
        """One forward pass on a worker thread (:func:`tito_transformers.scoring.token_logprobs`)."""
        from tito_transformers.scoring import token_logprobs

        return await asyncio.to_thread(token_logprobs, self.model, list(token_ids))


class BackendScorer:
    """The engine's own score route (:meth:`~tito_core.backend.Backend.score`: one prefill's prompt logprobs)."""

    takes_images = False

    def __init__(self, backend: Backend, description: str | None = None) -> None:
        if not backend.supports_score:
            raise ConfigError(
                f"the {backend.capabilities().name} backend cannot score a token sequence: give --model to score "
                "with a model directory"
            )
        self.backend = backend
        self.description = description or f"the {backend.capabilities().name} engine's score route"

    async def score(self, token_ids: Sequence[int]) -> list[float | None]:
        """The engine's prompt logprobs of ``token_ids``, None first (the first token has no context)."""
        scored = await self.backend.score(token_ids)
        return [None, *scored]


class GapStats(msgspec.Struct, frozen=True):
    """Recorded against re-scored logprobs over a set of tokens (``r = new - old``).

    Attributes:
        tokens: How many tokens were compared.
        mean_abs: Mean of ``|r|`` (nats).
        max_abs: Largest ``|r|``.
        k3: Mean of ``exp(r) - 1 - r``: KL(behaviour || trainer) estimated on the behaviour's samples.
        mean_diff: Mean of ``r`` (positive: the scorer finds the tokens likelier than the engine did).
        ratio_p1: 1st percentile of the importance ratio ``exp(r)``.
        ratio_p50: Its median.
        ratio_p99: Its 99th percentile.
    """

    tokens: int
    mean_abs: float
    max_abs: float
    k3: float
    mean_diff: float
    ratio_p1: float
    ratio_p50: float
    ratio_p99: float


def gap_stats(diffs: Sequence[float]) -> GapStats:
    """The :class:`GapStats` of ``diffs`` (each ``new - old``); NaN statistics for none."""
    if not diffs:
        nan = math.nan
        return GapStats(tokens=0, mean_abs=nan, max_abs=nan, k3=nan, mean_diff=nan, ratio_p1=nan, ratio_p50=nan,
                        ratio_p99=nan)  # fmt: skip
    n = len(diffs)
    ordered = sorted(diffs)

    def ratio_at(q: float) -> float:
        return math.exp(min(ordered[min(n - 1, int(q * (n - 1) + 0.5))], 700.0))

    return GapStats(
        tokens=n,
        mean_abs=sum(abs(r) for r in diffs) / n,
        max_abs=max(abs(ordered[0]), abs(ordered[-1])),
        k3=sum(math.expm1(r) - r if r < 700 else math.inf for r in diffs) / n,  # expm1: tiny gaps stay exact
        mean_diff=sum(diffs) / n,
        ratio_p1=ratio_at(0.01),
        ratio_p50=ratio_at(0.5),
        ratio_p99=ratio_at(0.99),
    )


class AuditReport(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`audit` found.

    Attributes:
        scorer: What scored the tokens.
        records: Records read.
        branches: Branches scored.
        all: Every scored trained token.
        free: The tokens of unconstrained turns: what ``--max-kl`` gates on.
        constrained: The tokens of constrained (forced) turns: post-constraint logprobs, apart.
        by: For each of :data:`AXES`, the stats per value (turn index, branch, weight version, engine URL, finish
            reason, ``free`` / ``constrained``, ``with images`` / ``without images``), as strings.
        skipped: Why tokens or records were not scored, with counts.
        tokens: With ``per_token``: per rollout (``task_id:sample``) and branch number, each token's
            ``new - old`` logprob (None where not scored), for ``tito view --audit``.
    """

    scorer: str
    records: int
    branches: int
    all: GapStats
    free: GapStats
    constrained: GapStats
    by: dict[str, dict[str, GapStats]]
    skipped: dict[str, int]
    tokens: dict[str, dict[str, list[float | None]]] | None = None

    def to_json(self) -> bytes:
        """The report as JSON (NaN, for an empty selection, written as null)."""
        return msgspec.json.encode(_nan_to_none(msgspec.to_builtins(self)))


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else value
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    return value


class Ledger:
    """Collects ``r = new - old`` per trained token, keyed by every breakdown; :meth:`report` sums it up."""

    def __init__(self, scorer: Scorer, *, per_token: bool = False) -> None:
        self.scorer = scorer
        self.tokens: dict[str, dict[str, list[float | None]]] | None = {} if per_token else None
        self.records = 0
        self.branches = 0
        self._all: list[float] = []
        self._by: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.skipped: dict[str, int] = defaultdict(int)

    async def add(self, record: RolloutRecord) -> None:
        """Score every branch of ``record`` and file its trained tokens."""
        self.records += 1
        traj = Trajectory.from_record(record.trajectory)
        for branch in traj.all_branches:
            if not any(segment.kind == "output" for segment in branch.segments):
                self.skipped["branches without output"] += 1
                continue
            await self._add_branch(branch, record.server, f"{record.task_id}:{record.sample}")

    async def _add_branch(self, branch: Trajectory, server: str | None, key: str) -> None:
        ids, mask, old = branch.token_ids, branch.loss_mask, branch.logprobs
        first_image = min((span.start for span in branch.media), default=len(ids))
        if first_image < len(ids) and not self.scorer.takes_images:
            later = sum(mask[first_image:])
            if later:
                self.skipped["trained tokens after an image (the scorer takes no images)"] += later
            ids_scored = ids[:first_image]
        else:
            ids_scored = ids
        if not any(mask[branch.fork_at or 0 : len(ids_scored)]):
            return
        new = await self.scorer.score(ids_scored)
        if len(new) != len(ids_scored):
            raise ConfigError(f"the scorer gave {len(new)} logprobs for {len(ids_scored)} tokens")
        self.branches += 1
        turns = {turn.index: turn for turn in branch.turns}
        versions = branch.token_weight_versions() or [None] * len(ids)
        turn_of = [0] * len(ids)
        for segment in branch.segments:
            turn_of[segment.start : segment.end] = [segment.turn] * segment.length
        has_images = bool(branch.media)
        per_token: list[float | None] | None = None
        if self.tokens is not None:
            per_token = self.tokens.setdefault(key, {}).setdefault(str(branch.branch), [None] * len(ids))
        own = branch.fork_at or 0  # a later branch starts with a copy of its parent's tokens: filed once, there
        for i in range(own, len(ids_scored)):
            o, n = old[i], new[i]
            if not mask[i]:
                continue
            if o is None or n is None:
                self.skipped["trained tokens without a recorded or re-scored logprob"] += 1
                continue
            r = n - o
            self._all.append(r)
            if per_token is not None:
                per_token[i] = r
            turn = turns.get(turn_of[i])
            keys = {
                "turn": str(turn_of[i]),
                "branch": str(branch.branch),
                "weight_version": versions[i] or "unknown",
                "server": server or "unknown",
                "finish_reason": turn.finish_reason if turn is not None else "unknown",
                "constrained": "constrained" if turn is not None and turn.constrained else "free",
                "images": "with images" if has_images and i > first_image else "without images",
            }
            for axis, value in keys.items():
                self._by[(axis, value)].append(r)

    def report(self) -> AuditReport:
        """The stats of everything added so far."""
        by: dict[str, dict[str, GapStats]] = {axis: {} for axis in AXES}
        for (axis, value), diffs in sorted(self._by.items(), key=lambda item: (item[0][0], _natural(item[0][1]))):
            by[axis][value] = gap_stats(diffs)
        return AuditReport(
            scorer=self.scorer.description,
            records=self.records,
            branches=self.branches,
            all=gap_stats(self._all),
            free=gap_stats(self._by.get(("constrained", "free"), [])),
            constrained=gap_stats(self._by.get(("constrained", "constrained"), [])),
            by=by,
            skipped=dict(self.skipped),
            tokens=self.tokens,
        )


def _natural(value: str) -> tuple[int, int | str]:
    return (0, int(value)) if value.isdigit() else (1, value)


async def audit(
    records: Iterable[RolloutRecord],
    scorer: Scorer,
    *,
    progress: Callable[[int], None] | None = None,
    per_token: bool = False,
) -> AuditReport:
    """Score ``records`` with ``scorer`` and report the gaps (``progress`` is called after each record).

    With ``per_token``, the report also holds every scored token's gap (:attr:`AuditReport.tokens`).
    """
    ledger = Ledger(scorer, per_token=per_token)
    for record in records:
        await ledger.add(record)
        if progress is not None:
            progress(ledger.records)
    return ledger.report()
