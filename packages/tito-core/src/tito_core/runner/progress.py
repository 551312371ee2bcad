"""How a run reports itself: a live rich progress bar and summary table, JSON lines for clusters, or nothing."""

from __future__ import annotations

import statistics
import sys
from typing import IO, Any, Protocol

import msgspec

from ..records import RolloutRecord
from .summary import RunStats, RunSummary

__all__ = ["JsonReporter", "QuietReporter", "Reporter", "RichReporter", "summary_table"]

GROUP_ROWS = 20
"""Groups shown in the summary's table; the rest are counted (the caption covers every group)."""


class Reporter(Protocol):
    """Receives a run's events, all on the run's event loop."""

    def start(self, stats: RunStats) -> None:
        """The run begins (``stats.planned`` rollouts to do, ``stats.skipped`` already done)."""

    def started(self, stats: RunStats) -> None:
        """A rollout started."""

    def record(self, record: RolloutRecord, stats: RunStats) -> None:
        """A record was written, or dropped as stale (:meth:`RunStats.was_dropped`)."""

    def finish(self, summary: RunSummary) -> None:
        """The run ended (completely or not: ``summary.interrupted``)."""


class QuietReporter:
    """Reports nothing."""

    def start(self, stats: RunStats) -> None:
        """Nothing."""

    def started(self, stats: RunStats) -> None:
        """Nothing."""

    def record(self, record: RolloutRecord, stats: RunStats) -> None:
        """Nothing."""

    def finish(self, summary: RunSummary) -> None:
        """Nothing."""


class JsonReporter(QuietReporter):
    """One JSON object per line: ``start``, one ``rollout`` per finished rollout, ``summary``.

    A ``rollout`` line of a stale rollout that was not written (``rollout.stale = "drop"``) has ``"dropped": true``.
    """

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr

    def _emit(self, event: dict[str, Any]) -> None:
        self.stream.write(msgspec.json.encode(event).decode() + "\n")
        self.stream.flush()

    def start(self, stats: RunStats) -> None:
        """A ``start`` line."""
        self._emit({"event": "start", "output": stats.output, "planned": stats.planned, "skipped": stats.skipped})

    def record(self, record: RolloutRecord, stats: RunStats) -> None:
        """A ``rollout`` line."""
        self._emit(
            {
                "event": "rollout",
                "task_id": record.task_id,
                "sample": record.sample,
                "status": record.status,
                "status_reason": record.status_reason,
                "reward": record.reward,
                "server": record.server,
                "output_tokens": record.tokens.output,
                "wall_s": round(record.timings.wall_s, 4),
                "weight_version_min": record.weight_version_min,
                "weight_version_max": record.weight_version_max,
                "staleness": record.staleness,
                "stale": record.stale,
                "dropped": stats.was_dropped(record),
                "done": stats.done,
                "in_flight": stats.in_flight,
            }
        )

    def finish(self, summary: RunSummary) -> None:
        """A ``summary`` line."""
        self._emit({"event": "summary", **msgspec.to_builtins(summary)})


class RichReporter:
    """A live progress bar (done / in flight / failed, rollouts/s, tokens/s, mean reward), then a summary table."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console

        self.console = console if console is not None else Console(stderr=True)
        self._progress: Any = None
        self._task: Any = None

    def start(self, stats: RunStats) -> None:
        """Show the bar."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("[bold]rollouts"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[line]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        if stats.skipped:
            self.console.print(f"resuming {stats.output}: {stats.skipped} rollouts already done, skipped")
        self._task = self._progress.add_task("rollouts", total=stats.planned, line=self._line(stats))
        self._progress.start()

    def _line(self, stats: RunStats) -> str:
        mean = stats.mean_reward()
        reward = "-" if mean is None else f"{mean:.3f}"
        stale = f"  stale {stats.stale + stats.dropped}" if stats.max_staleness is not None else ""
        return (
            f"in flight {stats.in_flight}  failed {stats.failed}{stale}  {stats.written / stats.elapsed:.2f} "
            f"rollouts/s  {stats.output_tokens / stats.elapsed:,.0f} tok/s  reward {reward}"
        )

    def started(self, stats: RunStats) -> None:
        """Update the in-flight count."""
        if self._progress is not None:
            self._progress.update(self._task, line=self._line(stats))

    def record(self, record: RolloutRecord, stats: RunStats) -> None:
        """Advance the bar."""
        if self._progress is not None:
            self._progress.update(self._task, completed=stats.done, line=self._line(stats))

    def finish(self, summary: RunSummary) -> None:
        """Stop the bar and print the summary table."""
        if self._progress is not None:
            self._progress.stop()
        self.console.print(summary_table(summary))


def _version_line(summary: RunSummary) -> str:
    low, high = summary.weight_version_min, summary.weight_version_max
    span = "- (none reported)" if low is None or high is None else (low if low == high else f"{low}..{high}")
    return span if summary.current_version is None else f"{span} (current {summary.current_version})"


def _stale_line(summary: RunSummary) -> str:
    """How many rollouts were stale, and what became of them."""
    limit = f"more than {summary.max_staleness} versions behind {summary.current_version}"
    if summary.dropped:
        return f"{summary.dropped} dropped ({limit}; not written, a rerun runs them again)"
    if summary.stale:
        return f"{summary.stale} marked stale ({limit}; written with stale=true)"
    return f"none ({limit})"


def summary_table(summary: RunSummary) -> Any:
    """The end-of-run summary as a rich renderable."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def num(value: float | None, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    head = Table(title="tito rollout" + (" (interrupted)" if summary.interrupted else ""), show_header=False)
    head.add_column(style="bold")
    head.add_column()
    head.add_row("output", summary.output)
    head.add_row("written", f"{summary.written} of {summary.planned} (skipped {summary.skipped} already done)")
    head.add_row("statuses", ", ".join(f"{k} {v}" for k, v in summary.statuses.items()) or "-")
    head.add_row("reward", f"mean {num(summary.reward_mean)}  std {num(summary.reward_std)}")
    if summary.file_records != summary.written:  # a resumed run: the whole file, too
        statuses = ", ".join(f"{k} {v}" for k, v in summary.file_statuses.items()) or "-"
        head.add_row(
            "whole file",
            f"{summary.file_records} records: {statuses}; reward mean {num(summary.file_reward_mean)}"
            f"  std {num(summary.file_reward_std)}",
        )
    head.add_row("tokens", f"{summary.total_tokens:,} total, {summary.output_tokens:,} generated")
    head.add_row("weight versions", _version_line(summary))
    if summary.max_staleness is not None:
        head.add_row("stale", _stale_line(summary))
    if summary.partial_calls:
        head.add_row("partial rollouts", f"{summary.partial_calls} calls cut by a weight update and continued")
    head.add_row(
        "throughput",
        f"{summary.rollouts_per_s:.2f} rollouts/s, {summary.output_tokens_per_s:,.1f} output tok/s "
        f"over {summary.wall_s:.1f} s",
    )
    parts: list[Any] = [head]
    if summary.servers:
        servers = Table(title="servers")
        servers.add_column("server")
        servers.add_column("rollouts", justify="right")
        servers.add_column("share", justify="right")
        total = sum(summary.servers.values())
        for name, count in summary.servers.items():
            servers.add_row(name, str(count), f"{100 * count / total:.0f}%")
        parts.append(servers)
    if summary.groups:
        stds = [g.reward_std for g in summary.groups if g.reward_std is not None]
        flat = sum(1 for g in summary.groups if g.rollouts > 1 and g.reward_std == 0)
        groups = Table(title="groups")
        for column in ("task", "rollouts", "reward mean", "reward std"):
            groups.add_column(column, justify="left" if column == "task" else "right")
        for g in summary.groups[:GROUP_ROWS]:
            groups.add_row(g.task_id, str(g.rollouts), num(g.reward_mean), num(g.reward_std))
        if len(summary.groups) > GROUP_ROWS:
            groups.add_row(f"… {len(summary.groups) - GROUP_ROWS} more groups", "", "", "")
        spread = (
            f"{len(summary.groups)} groups: per-group reward std mean {num(statistics.fmean(stds) if stds else None)}"
            f"; {flat} with equal rewards (no GRPO signal)"
        )
        parts.extend([groups, Text(spread)])
    return Group(*parts)
