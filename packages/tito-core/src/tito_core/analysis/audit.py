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
A turn that truncated sampling recorded its kept sets and the logprobs over them: a scorer that gives logits
(:class:`TransformersScorer`) re-scores its tokens over the same kept sets at the same temperature (``new`` in the
ledger), and once more over the whole vocabulary, the common mistake, reported apart (``kept_sets`` against
``kept_sets_full_vocabulary``: the second is off by ``log S``); a scorer that gives token logprobs only skips them.
A vision-language model (:class:`TransformersScorer` on a Qwen2.5-VL directory) scores records with images: it sees
their pixels as the embedded backend did when it sampled. A text-only scorer cannot score the tokens that follow an
image (their context holds pixels it does not see): :func:`check_scorable` refuses such records before any scoring
(``tito audit`` calls it), and the ledger counts those tokens as skipped for a scorer given them anyway.

Each report also holds, per rollout, its own figures and a fingerprint of its token ids
(:attr:`AuditReport.rollouts`): ``tito view --audit`` shows the figures as columns and refuses a report made from
other records.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import msgspec

from ..backend import Backend
from ..errors import ConfigError
from ..media import PromptMedia
from ..records import RolloutRecord, highest_token_id, rollout_digest
from ..trajectory import Trajectory

__all__ = [
    "AXES",
    "AuditReport",
    "BackendScorer",
    "GapStats",
    "Ledger",
    "ModelFacts",
    "RolloutGaps",
    "Scorer",
    "TransformersScorer",
    "audit",
    "check_scorable",
    "gap_stats",
    "model_facts",
]

AXES = (
    "turn",
    "free_turn",
    "constrained_turn",
    "branch",
    "lineage",
    "weight_version",
    "server",
    "finish_reason",
    "constrained",
    "images",
)
"""The breakdowns of a report, each a key of :attr:`AuditReport.by` (``free_turn`` and ``constrained_turn``: by turn
index, the free turns' tokens and the constrained ones' apart; ``lineage``: a branch's label, else its fork kind,
``root`` for the first branch)."""


class Scorer(Protocol):
    """Scores a token sequence with the weights under audit."""

    description: str
    """What scores (a model directory and dtype, an engine URL): the report names it."""

    takes_images: bool
    """Whether :meth:`score` sees the images of a sequence (it is then given ``media``); a text-only scorer is given
    the tokens before the first image only."""

    async def score(self, token_ids: Sequence[int], media: Sequence[PromptMedia] = ()) -> list[float | None]:
        """``log p(token_ids[i] | token_ids[:i])`` for every position (None at 0 and where there is none).

        ``media``: the images and videos among ``token_ids`` (only for a scorer that :attr:`takes_images`).
        """
        ...


class ModelFacts(msgspec.Struct, frozen=True):
    """What a model directory's ``config.json`` says, read before its weights load (:func:`model_facts`).

    Attributes:
        path: The directory.
        model_type: Its ``model_type``.
        vocab_size: Its vocabulary (the text model's): every token id of its records is below it.
        vision: A vision-language model (a ``vision_config``): it sees images.
    """

    path: str
    model_type: str
    vocab_size: int | None
    vision: bool


def model_facts(path: str | os.PathLike[str], what: str = "--model") -> ModelFacts:
    """Read ``path/config.json`` (no weights, no transformers); ``what`` names the path in an error.

    Raises:
        ConfigError: No such directory, or no readable ``config.json`` in it.
    """
    folder = os.fspath(path)
    if not os.path.isdir(folder):
        raise ConfigError(f"{what} {folder}: no such model directory")
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(f"{what} {folder}: not a model directory (config.json: {reason})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{what} {folder}: not a model directory (config.json is not an object)")
    text_config = config.get("text_config")
    text: dict[str, Any] = text_config if isinstance(text_config, dict) else {}
    vocab = config.get("vocab_size") or text.get("vocab_size")
    return ModelFacts(
        path=folder,
        model_type=str(config.get("model_type", "unknown")),
        vocab_size=int(vocab) if isinstance(vocab, int) else None,
        vision=isinstance(config.get("vision_config"), dict),
    )


def check_scorable(records: Sequence[RolloutRecord], *, scorer: str, vocab_size: int | None, images: bool) -> None:
    """Refuse, before any scoring, records that ``scorer`` cannot score.

    Token ids beyond its vocabulary are another model's records; images need a scorer that takes them.

    Raises:
        ConfigError: One line naming what does not fit.
    """
    highest = highest_token_id(records)
    if vocab_size is not None and highest >= vocab_size:
        raise ConfigError(
            f"these records were not made with the tokenizer of {scorer}: they hold token id {highest}, beyond "
            f"its vocabulary of {vocab_size} ids"
        )
    pictured = sum(1 for r in records if any(b.media for b in (*r.trajectory.branches, r.trajectory)))
    if pictured and not images:
        have = "1 record has" if pictured == 1 else f"{pictured} records have"
        raise ConfigError(
            f"{have} images, and {scorer} takes none: audit them with the vision model they were made with "
            "(--model its directory, or a --config whose backend_options.model_path is it)"
        )


class TransformersScorer:
    """A teacher-forced forward pass of a Hugging Face model (tito-transformers), float32 logits.

    Args:
        model_path: A local model directory.
        dtype: The weights' dtype (``float32`` by default, as a CPU trainer computes).
        num_threads: torch threads.
    """

    def __init__(self, model_path: str | os.PathLike[str], *, dtype: str = "float32", num_threads: int = 1) -> None:
        try:
            from tito_transformers.scoring import load_model, vision_of
        except ImportError as exc:
            raise ConfigError(
                'scoring with a model directory needs tito-transformers: pip install "tito-core[transformers]" '
                f"(or score with the engine: --config) ({exc})"
            ) from exc
        self.model = load_model(str(model_path), dtype=dtype, num_threads=num_threads)
        self.vision = vision_of(self.model, str(model_path))
        self.takes_images = self.vision is not None
        self.description = f"transformers forward pass of {model_path} ({dtype})"

    async def score(self, token_ids: Sequence[int], media: Sequence[PromptMedia] = ()) -> list[float | None]:
        """One forward pass on a worker thread (:func:`tito_transformers.scoring.token_logprobs`).

        A vision model sees ``media`` as the embedded backend did when it sampled.
        """
        from tito_transformers.scoring import token_logprobs

        return await asyncio.to_thread(token_logprobs, self.model, list(token_ids), media=media, vision=self.vision)

    async def score_kept(
        self, token_ids: Sequence[int], kept: dict[int, tuple[list[int], float]], media: Sequence[PromptMedia] = ()
    ) -> tuple[list[float | None], list[float | None]]:
        """The positions of ``kept`` scored over their kept sets and over the whole vocabulary, in one forward pass.

        :func:`tito_transformers.scoring.kept_token_logprobs` on a worker thread.
        """
        from tito_transformers.scoring import kept_token_logprobs

        return await asyncio.to_thread(
            kept_token_logprobs, self.model, list(token_ids), kept, media=media, vision=self.vision
        )


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

    async def score(self, token_ids: Sequence[int], media: Sequence[PromptMedia] = ()) -> list[float | None]:
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


class RolloutGaps(msgspec.Struct, frozen=True, kw_only=True):
    """One rollout's figures in a report, and what ties them to its record.

    Attributes:
        digest: :func:`~tito_core.records.rollout_digest` of the record audited.
        all: Its scored trained tokens (every branch).
        free: Those of its free turns.
    """

    digest: str
    all: GapStats
    free: GapStats


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
        rollouts: Per rollout (``task_id:sample``), its own figures and its record's fingerprint.
        kept_sets: The tokens of turns that truncated sampling, re-scored over their kept sets (also in ``all``):
            the engine's numeric noise when the weights are the same.
        kept_sets_full_vocabulary: The same tokens re-scored over the whole vocabulary at the same temperature, the
            common mistake: ``mean_diff`` is the mean ``log S``.
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
    rollouts: dict[str, RolloutGaps] = msgspec.field(default_factory=dict)
    kept_sets: GapStats | None = None
    kept_sets_full_vocabulary: GapStats | None = None

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
        self._rollouts: dict[str, tuple[str, list[float], list[float]]] = {}
        self._kept: tuple[list[float], list[float]] = ([], [])  # kept-set tokens: with the mask, without

    async def add(self, record: RolloutRecord) -> None:
        """Score every branch of ``record`` and file its trained tokens."""
        self.records += 1
        key = f"{record.task_id}:{record.sample}"
        self._rollouts[key] = (rollout_digest(record), [], [])
        traj = Trajectory.from_record(record.trajectory)
        for branch in traj.all_branches:
            if not any(segment.kind == "output" for segment in branch.segments):
                self.skipped["branches without output"] += 1
                continue
            await self._add_branch(branch, record.server, key)

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
        media = branch.prompt_media() if self.scorer.takes_images and branch.media else ()
        new = await self.scorer.score(ids_scored, media) if media else await self.scorer.score(ids_scored)
        if len(new) != len(ids_scored):
            raise ConfigError(f"the scorer gave {len(new)} logprobs for {len(ids_scored)} tokens")
        kept = _kept_sets(branch, len(ids_scored))
        score_kept = getattr(self.scorer, "score_kept", None)
        full: list[float | None] = []
        if kept and score_kept is not None:
            renormalised, full = await score_kept(ids_scored, kept, media)
            new = [renormalised[i] if i in kept else n for i, n in enumerate(new)]
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
        _, rollout_all, rollout_free = self._rollouts[key]
        own = branch.fork_at or 0  # a later branch starts with a copy of its parent's tokens: filed once, there
        for i in range(own, len(ids_scored)):
            o, n = old[i], new[i]
            if not mask[i]:
                continue
            if i in kept and not full:
                self.skipped["trained tokens sampled from a kept set (the scorer gives no logits to renormalise)"] += 1
                continue
            if o is None or n is None:
                self.skipped["trained tokens without a recorded or re-scored logprob"] += 1
                continue
            r = n - o
            if i in kept and (whole := full[i]) is not None:
                self._kept[0].append(r)
                self._kept[1].append(whole - o)
            self._all.append(r)
            if per_token is not None:
                per_token[i] = r
            turn = turns.get(turn_of[i])
            forced = turn is not None and turn.constrained
            rollout_all.append(r)
            if not forced:
                rollout_free.append(r)
            keys = {
                "turn": str(turn_of[i]),
                "constrained_turn" if forced else "free_turn": str(turn_of[i]),
                "branch": str(branch.branch),
                "lineage": branch.label or branch.fork_kind or ("root" if branch.parent_branch is None else "fork"),
                "weight_version": versions[i] or "unknown",
                "server": server or "unknown",
                "finish_reason": turn.finish_reason if turn is not None else "unknown",
                "constrained": "constrained" if forced else "free",
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
            rollouts={
                key: RolloutGaps(digest=digest, all=gap_stats(diffs), free=gap_stats(free))
                for key, (digest, diffs, free) in self._rollouts.items()
            },
            kept_sets=gap_stats(self._kept[0]) if self._kept[0] else None,
            kept_sets_full_vocabulary=gap_stats(self._kept[1]) if self._kept[1] else None,
        )


def _kept_sets(branch: Trajectory, length: int) -> dict[int, tuple[list[int], float]]:
    """Each output position below ``length`` of a turn with kept sets: its kept set and temperature."""
    kept: dict[int, tuple[list[int], float]] = {}
    for turn in branch.turns:
        mask = turn.sampling_mask
        if mask is None:
            continue
        for i, row in enumerate(mask.to_lists()):
            if turn.output_start + i < length:
                kept[turn.output_start + i] = (row, mask.temperature)
    return kept


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
