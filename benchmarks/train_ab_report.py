"""The figures of ``benchmarks/train_ab.py``: one PNG of both arms' curves, and a table of their means."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

# one colour family per arm, one shade per seed (darker = later seed), so seeds can be told apart
BLUES, ORANGES = ("#9ecae1", "#4292c6", "#08519c"), ("#fdae6b", "#f16913", "#a63603")
GREENS, PURPLES = ("#a1d99b", "#41ab5d", "#006d2c"), ("#bcbddc", "#807dba", "#54278f")  # the arms with TIS
COLOURS = {"tito": BLUES, "text": ORANGES, "mask": BLUES, "full": ORANGES}
COLOURS.update({"tito+tis": GREENS, "text+tis": PURPLES, "mask+tis": GREENS, "full+tis": PURPLES})
STYLES = ("-", "--", ":")
PANELS = (
    ("reward", "train reward (mean of the step's rollouts)"),
    ("eval_accuracy", "held-out greedy accuracy"),
    ("drift_changed_share", "share of tito's trained tokens the text stack changes"),
    ("k3", "k3 KL(sampler || trainer), sampled tokens"),
    ("ratio_p99", "importance ratio - 1: p1, p50, p99"),
    ("grad_norm", "gradient norm (before clipping)"),
)
TRUNCATED_PANELS = (
    *PANELS[:2],
    ("log_s_mean", "mean log S (kept mass, trainer's logits)"),
    *PANELS[3:5],
    ("clipped_share", "share of ratios outside [0.8, 1.2]"),
)
TITLES = {
    "drift": "SmolLM2-135M + LoRA, PPO-clip: trained on tito's recorded ids vs a text stack's",
    "truncated": "SmolLM2-135M + LoRA, PPO-clip, top-p/top-k sampling: the trainer over the kept sets (mask) vs the "
    "whole vocabulary (full)",
}


def figure_title(settings: dict[str, Any]) -> str:
    """The figure's title: the pair's, or for a run on an engine what it trained and how (the decisive run's)."""
    pair = settings.get("pair", "drift")
    if not settings.get("engine_url"):
        return TITLES[pair]
    model = Path(str(settings.get("model_dir"))).name
    how = "full fine-tuning" if not settings.get("lora_rank") else f"LoRA rank {settings['lora_rank']}"
    off = (
        f"{settings.get('ppo_epochs', 1)} epochs x {settings.get('minibatches', 1)} minibatches, "
        f"{settings.get('staleness', 0)} step(s) stale"
    )
    arms = "kept sets (mask) vs whole vocabulary (full)" if pair == "truncated" else "tito vs a text stack"
    tis = f", TIS cap {settings['tis']}" if settings.get("tis") else ""
    return f"{model}, {how}, sampled on SGLang: {arms}; {off}{tis}"


def smooth(values: Sequence[float | None], width: int = 5) -> list[float | None]:
    """A trailing mean over the last ``width`` known values (None where there is none yet)."""
    out: list[float | None] = []
    window: list[float] = []
    for value in values:
        if value is not None:
            window = [*window[-(width - 1) :], value]
        out.append(sum(window) / len(window) if window else None)
    return out


def _series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def colour(arm: str, index: int) -> str:
    """The shade of ``arm``'s family for the ``index``-th seed of the run (cycling past three)."""
    shades = COLOURS.get(arm, ("0.6", "0.4", "0.2"))
    return shades[index % len(shades)]


def plot(result: dict[str, Any], path: Path) -> None:
    """Six panels, both arms of every seed (a shade and a line style per seed; reward also smoothed over 5 steps).

    The ratio panel draws ratio - 1 on a symlog axis: tito's ratios lie within ~2e-5 of 1 and the text arm's are
    exactly 1, which a linear axis around 1 can only show with an offset label.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pair = result["settings"].get("pair", "drift")
    fig, axes = plt.subplots(2, 3, figsize=(13.5, 6.6), dpi=100)
    for ax, (key, title) in zip(axes.flat, TRUNCATED_PANELS if pair == "truncated" else PANELS, strict=True):
        for index, run in enumerate(result["runs"]):
            for arm, data in run["arms"].items():
                rows, shade, line = data["rows"], colour(arm, index), STYLES[index % len(STYLES)]
                label = f"{arm} (seed {run['seed']})"
                if key == "reward":
                    steps, values = _series(rows, key)
                    ax.plot(steps, values, color=shade, alpha=0.2, lw=0.8)
                    smoothed = smooth(values)
                    ax.plot(steps, smoothed, line, color=shade, lw=1.6, label=label)
                elif key == "eval_accuracy":
                    steps, values = _series(rows, key)
                    ax.plot([0, *steps], [data["eval_0"], *values], "o" + line, color=shade, label=label, ms=3)
                elif key == "ratio_p99":
                    for quantile, width in (("ratio_p1", 0.7), ("ratio_p50", 1.3), ("ratio_p99", 0.7)):
                        steps, values = _series(rows, quantile)
                        ax.plot(steps, [v - 1 for v in values], line, color=shade, lw=width)
                else:
                    steps, values = _series(rows, key)
                    ax.plot(steps, values, line, color=shade, lw=1.2, label=label)
        if key == "k3":
            ax.set_yscale("symlog", linthresh=1e-10)
        if key == "ratio_p99":
            ax.set_yscale("symlog", linthresh=1e-6 if pair == "drift" else 1e-3)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7, ncol=2)
    fig.suptitle(figure_title(result["settings"]), fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _deviation(ratio: float | None) -> str:
    """A ratio as its distance from 1 (``-1.7e-06``, ``0`` when exactly 1): four decimals would read 1.0000."""
    if ratio is None:
        return "-"
    return "0" if ratio == 1 else f"{ratio - 1:+.1e}"


def arm_summary(data: dict[str, Any]) -> dict[str, Any]:
    """An arm's run in a few numbers: rewards early and late, held-out before and after, the means per step."""
    rows = data["rows"]
    fifth = max(1, len(rows) // 5)
    evals = [r["eval_accuracy"] for r in rows if r["eval_accuracy"] is not None]
    return {
        "reward_first": _mean([r["reward"] for r in rows[:fifth]]),
        "reward_last": _mean([r["reward"] for r in rows[-fifth:]]),
        "eval_before": data["eval_0"],
        "eval_after": evals[-1] if evals else None,
        "eval_best": max([data["eval_0"], *evals]),
        "drift_changed_share": _mean([r["drift_changed_share"] for r in rows]),
        "drift_added_share": _mean([r["drift_added_share"] for r in rows]),
        "k3": _mean([r["k3"] for r in rows]),
        "log_s_mean": _mean([r.get("log_s_mean") for r in rows]),
        "clipped_share": _mean([r.get("clipped_share") for r in rows]),
        "ratio_p1": min((r["ratio_p1"] for r in rows if r["ratio_p1"] is not None), default=None),
        "ratio_p99": max((r["ratio_p99"] for r in rows if r["ratio_p99"] is not None), default=None),
        "grad_norm": _mean([r["grad_norm"] for r in rows if r["groups_with_signal"]]),
        "trained_tokens": _mean([r["trained_tokens"] for r in rows]),
        "minutes": data["wall_s"] / 60,
    }


def summary_table(result: dict[str, Any]) -> str:
    """A Markdown table, one line per arm and seed (the truncated pair: log S and the clipped share for the drift)."""
    truncated = result["settings"].get("pair") == "truncated"
    middle = "mean log S / ratios clipped" if truncated else "ids changed / added"
    lines = [
        f"| seed | arm | reward, first fifth -> last fifth | held-out before -> after (best) | {middle} "
        "| k3 (mean per step) | ratio - 1, p1 .. p99 (all steps) | grad norm | trained tokens / step | minutes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in result["runs"]:
        for arm, data in run["arms"].items():
            s = arm_summary(data)
            if truncated:
                middle = f"{_fmt(s['log_s_mean'], '.3f')} / {_fmt(s['clipped_share'], '.1%')}"
            else:
                middle = f"{_fmt(s['drift_changed_share'], '.1%')} / {_fmt(s['drift_added_share'], '.1%')}"
            lines.append(
                f"| {run['seed']} | {arm} | {_fmt(s['reward_first'], '.3f')} -> {_fmt(s['reward_last'], '.3f')} "
                f"| {_fmt(s['eval_before'], '.3f')} -> {_fmt(s['eval_after'], '.3f')} ({_fmt(s['eval_best'], '.3f')}) "
                f"| {middle} | {_fmt(s['k3'], '.2e')} | {_deviation(s['ratio_p1'])} .. {_deviation(s['ratio_p99'])} "
                f"| {_fmt(s['grad_norm'], '.3f')} | {_fmt(s['trained_tokens'], '.0f')} | {s['minutes']:.1f} |"
            )
    return "\n".join(lines)
