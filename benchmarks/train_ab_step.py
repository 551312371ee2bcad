"""The A/B's training step: PPO-clip over an arm's rows, one update or several epochs of minibatches, TIS optional.

What every arm of ``benchmarks/train_ab.py`` shares: a :class:`Row` is one rollout (or one leaf of its token tree) as
the arm's trainer takes it; :func:`ppo_step` is one optimizer step on rows; :func:`train_batch` is the off-policy
form: the trainer's own logprobs at the start of the batch (the *proximal* policy, as verl and OpenRLHF recompute
``old_log_prob``), ``epochs`` passes of ``minibatches`` updates each, and with ``tis`` truncated importance
sampling (each token's loss weighted by ``min(pi_proximal / pi_behaviour, C)``, :func:`tis_weights`).
"""

from __future__ import annotations

import math
import random
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

HERE = Path(__file__).resolve().parent
if str(HERE.parent / "examples" / "train_reinforce") not in sys.path:
    sys.path.insert(0, str(HERE.parent / "examples" / "train_reinforce"))  # the demo's grouped forward

import train_reinforce as demo  # noqa: E402

CLIP = 0.2
OldLogprobs = Literal["behaviour", "trainer"]
"""What the PPO ratio divides by: the recorded (behaviour) logprobs, or the trainer's own at the start of the batch."""


@dataclass
class Row:
    """One rollout as an arm's trainer takes it; the lists run over the loss tokens, in order."""

    token_ids: list[int]
    loss_mask: list[int]
    advantage: float
    group: int
    old: list[float | None]  # the behaviour logprob the arm has for the token; None: the trainer's own (detached)
    sampled: list[float | None]  # the sampler's logprob of this very token, where the arm still has it
    kept: tuple[list[int], list[int]] | None = None  # each loss token's kept set (CSR ids, offsets); [] = all
    proximal: list[float] | None = None  # the trainer's own logprobs at the start of the batch (--old trainer)


def loss_positions(mask: Sequence[int]) -> list[int]:
    """The positions the grouped forward scores: mask 1, never position 0 (nothing predicts it)."""
    return [i for i in range(1, len(mask)) if mask[i]]


def quantile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass(frozen=True)
class Scoring:
    """How the trainer scores rows with kept sets: ``softmax(logits / temperature)`` over each token's kept set.

    ``use_kept`` False: over the whole vocabulary instead (the common mistake), off by ``log S`` per token.
    """

    temperature: float
    use_kept: bool


def score_group(model: Any, members: Sequence[Row], scoring: Scoring | None) -> tuple[list[Any], list[Any]]:
    """Per row: the trainer's logprobs of its loss tokens (with grad), and their ``log S`` (detached).

    ``log S``: the log of the mass each kept set holds, by which a full-vocabulary logprob falls short (empty
    without ``scoring``).
    """
    import torch

    from tito_core.kept_logprobs import kept_logprobs

    if scoring is None:
        return demo.group_token_logprobs(model, members), [torch.zeros(0)] * len(members)  # type: ignore[arg-type]
    used, log_s = [], []
    for row, (logits, targets) in zip(members, demo.group_token_logits(model, members), strict=True):  # type: ignore[arg-type]
        if row.kept is None:
            raise SystemExit("a row without kept sets in the truncated pair")
        kept = kept_logprobs(logits, targets, row.kept, temperature=scoring.temperature)
        full = torch.log_softmax(logits / scoring.temperature, dim=-1).gather(1, targets[:, None])[:, 0]
        used.append(kept if scoring.use_kept else full)
        log_s.append((full - kept).detach())
    return used, log_s


def tis_weights(proximal: Sequence[float], behaviour: Sequence[float | None], cap: float) -> list[float]:
    """Truncated importance sampling: ``min(exp(proximal - behaviour), cap)`` per token, 1 where no behaviour logprob.

    The token-level TIS of Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
    (2025), as verl applies it (``docs/advance/rollout_is.md``: ``rollout_is_level: token``, ``rollout_is_mode:
    truncate``, threshold 2.0): the proximal logprob is the trainer's own at the start of the batch, the behaviour
    one the engine's (recorded). A token without a behaviour logprob (a forced turn's, or a text stack's re-render)
    is not corrected.
    """
    if cap <= 0:
        raise ValueError(f"the TIS cap must be positive, got {cap}")
    return [1.0 if b is None else min(math.exp(p - b), cap) for p, b in zip(proximal, behaviour, strict=True)]


@dataclass
class Figures:
    """What a batch's updates measured: ratios over every update, k3 and ``log S`` over the first pass only."""

    ratios: list[float] = field(default_factory=list)
    k3: list[float] = field(default_factory=list)
    log_masses: list[float] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    updates: int = 0
    signal: int = 0  # groups with a reward spread (counted in the first pass)
    first_pass: bool = True

    def summary(self, trained_tokens: int, cap: float | None) -> dict[str, Any]:
        """The step's row fields (``loss`` and ``grad_norm``: means over the updates that had a gradient)."""
        ratios, k3, weights = self.ratios, self.k3, self.weights
        return {
            "loss": sum(self.losses) / len(self.losses) if self.losses else 0.0,
            "trained_tokens": trained_tokens,
            "groups_with_signal": self.signal,
            "grad_norm": sum(self.grad_norms) / len(self.grad_norms) if self.grad_norms else 0.0,
            "updates": self.updates,
            "ratio_p1": quantile(ratios, 0.01),
            "ratio_p50": quantile(ratios, 0.5),
            "ratio_p99": quantile(ratios, 0.99),
            "clipped_share": sum(not 1 - CLIP <= r <= 1 + CLIP for r in ratios) / len(ratios) if ratios else None,
            "log_s_mean": sum(self.log_masses) / len(self.log_masses) if self.log_masses else None,  # free tokens
            "k3": sum(k3) / len(k3) if k3 else None,
            "k3_tokens": len(k3),
            "tis_weight_mean": sum(weights) / len(weights) if weights else None,
            "tis_capped_share": sum(w >= cap for w in weights) / len(weights) if weights and cap else None,
        }


def update(
    model: Any,
    optimizer: Any,
    rows: Sequence[Row],
    *,
    max_grad_norm: float,
    scoring: Scoring | None,
    tis: float | None,
    figures: Figures,
) -> None:
    """One PPO-clip optimizer step on ``rows``; groups without a reward spread are scored (no grad) for the figures.

    The ratio divides by each row's ``proximal`` logprobs where set, else by its ``old`` ones (the trainer's own where
    those are None); with ``tis``, each token's clipped surrogate is weighted by :func:`tis_weights`.
    """
    import torch

    model.train()
    optimizer.zero_grad(set_to_none=True)
    normaliser = sum(len(loss_positions(r.loss_mask)) for r in rows)
    groups: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        if loss_positions(row.loss_mask):
            groups[row.group].append(row)
    signal = 0
    total = 0.0
    for members in groups.values():
        learns = any(r.advantage != 0.0 for r in members)
        with torch.set_grad_enabled(learns):
            logps, log_s = score_group(model, members, scoring)
            terms = []
            for row, lp, mass in zip(members, logps, log_s, strict=True):
                if len(lp) != len(row.old):
                    raise SystemExit(f"scored {len(lp)} tokens for a row of {len(row.old)} loss tokens")
                detached = lp.detach().tolist()
                base = row.old if row.proximal is None else row.proximal
                old = torch.tensor(
                    [d if o is None else o for o, d in zip(base, detached, strict=True)], device=lp.device
                )
                ratio = torch.exp(lp - old)
                clipped = torch.clamp(ratio, 1 - CLIP, 1 + CLIP)
                surrogate = torch.minimum(ratio * row.advantage, clipped * row.advantage)
                if tis is not None:
                    if row.proximal is None:
                        raise SystemExit("TIS weighs by the trainer's own old logprobs: score them first (old=trainer)")
                    weights = tis_weights(row.proximal, row.old, tis)
                    surrogate = surrogate * torch.tensor(weights, device=lp.device)
                    if figures.first_pass:  # a token's weight is the same in every pass
                        figures.weights.extend(weights)
                terms.append(surrogate.sum())
                figures.ratios.extend(ratio.detach().tolist())
                if figures.first_pass:
                    figures.log_masses.extend(m for m, o in zip(mass.tolist(), row.old, strict=False) if o is not None)
                    for s, t in zip(row.sampled, detached, strict=True):
                        if s is not None:
                            figures.k3.append(math.expm1(t - s) - (t - s))
            loss = -torch.stack(terms).sum() / normaliser
        if learns:
            loss.backward()  # one group at a time: only its activations are held
            total += float(loss.detach())
            signal += 1
    params = [p for p in model.parameters() if p.requires_grad]
    if signal:
        figures.grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm)))
        figures.losses.append(total)
        optimizer.step()
    figures.updates += 1
    if figures.first_pass:
        figures.signal += signal
    model.eval()


def ppo_step(
    model: Any,
    optimizer: Any,
    rows: Sequence[Row],
    *,
    max_grad_norm: float,
    scoring: Scoring | None = None,
    tis: float | None = None,
) -> dict[str, Any]:
    """One PPO-clip update on ``rows`` (see :func:`update`); its figures.

    ``scoring``: how to score rows with kept sets (the truncated pair); None: ``log_softmax(logits)``.
    """
    figures = Figures()
    update(model, optimizer, rows, max_grad_norm=max_grad_norm, scoring=scoring, tis=tis, figures=figures)
    return figures.summary(sum(len(loss_positions(r.loss_mask)) for r in rows), tis)


def set_proximal(model: Any, rows: Sequence[Row], scoring: Scoring | None) -> None:
    """Score every row's loss tokens with the trainer's current weights (no grad) into ``Row.proximal``."""
    import torch

    model.eval()
    groups: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        if loss_positions(row.loss_mask):
            groups[row.group].append(row)
        else:
            row.proximal = []
    with torch.no_grad():
        for members in groups.values():
            logps, _ = score_group(model, members, scoring)
            for row, lp in zip(members, logps, strict=True):
                row.proximal = lp.tolist()


def minibatches(rows: Sequence[Row], count: int, rng: random.Random) -> list[list[Row]]:
    """``rows`` in at most ``count`` minibatches of whole groups (a group shares its prompt's forward pass).

    The groups are shuffled by ``rng`` and dealt out in turn; every row is in exactly one minibatch.
    """
    if count < 1:
        raise ValueError(f"the minibatch count must be at least 1, got {count}")
    groups: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        groups[row.group].append(row)
    keys = list(groups)
    if count > 1:
        rng.shuffle(keys)
    count = min(count, len(keys)) or 1
    return [[row for key in keys[i::count] for row in groups[key]] for i in range(count)]


def train_batch(
    model: Any,
    optimizer: Any,
    rows: Sequence[Row],
    *,
    max_grad_norm: float,
    scoring: Scoring | None = None,
    old: OldLogprobs = "behaviour",
    tis: float | None = None,
    epochs: int = 1,
    minibatches_per_epoch: int = 1,
    seed: int = 0,
) -> dict[str, Any]:
    """Train on one batch: ``epochs`` passes over it, each of ``minibatches_per_epoch`` updates; its figures.

    ``old="trainer"`` scores the batch once first (:func:`set_proximal`): every update's ratio divides by those
    logprobs (decoupled PPO), however far the updates have moved the weights. ``tis`` (needs ``old="trainer"``)
    weights each token by :func:`tis_weights`. With the defaults this is :func:`ppo_step`.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be at least 1, got {epochs}")
    if tis is not None and old != "trainer":
        raise ValueError("TIS weighs by pi_old(trainer) / pi_behaviour: it needs old='trainer'")
    if old == "trainer":
        set_proximal(model, rows, scoring)
    rng = random.Random(seed)
    figures = Figures()
    for epoch in range(epochs):
        figures.first_pass = epoch == 0
        for chunk in minibatches(rows, minibatches_per_epoch, rng):
            update(model, optimizer, chunk, max_grad_norm=max_grad_norm, scoring=scoring, tis=tis, figures=figures)
    return figures.summary(sum(len(loss_positions(r.loss_mask)) for r in rows), tis)
