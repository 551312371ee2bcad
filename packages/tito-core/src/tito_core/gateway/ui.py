"""The gateway's viewer (``/ui``): its open rollouts, live, and the last finished ones (:mod:`tito_core.viewer`).

Read-only, under the gateway's own rules (its ``Host`` and ``Origin`` checks), and every data route takes the
viewer key (``Access.authorize_viewer``): a rollout's token reads its own rollout
only, so sibling agents cannot read each other's through the viewer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..trajectory import Trajectory
from ..trajectory.record import TrajectoryRecord, snapshot
from ..versions import version_key
from ..viewer import TokenTexts, record_fields, record_view, run_row, runs_page
from ..viewer.pages import model_calls, weight_versions
from ..viewer.source import image_of
from .registry import GatewayRollout

__all__ = ["GatewaySource"]

OPEN, DONE = "open-", "done-"


class GatewaySource:
    """A gateway's rollouts as the viewer reads them: ``open-<id>`` while open, ``done-<n>`` once finished.

    Args:
        gateway: The :class:`~tito_core.gateway.Gateway` (its registry, records and tokenizer).
    """

    title = "tito serve"

    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway
        self._texts: TokenTexts | None = None

    @property
    def texts(self) -> TokenTexts:
        """Token texts with the gateway's tokenizer (loaded once it serves)."""
        if self._texts is None or self._texts.tokenizer is not self.gateway.tokenizer:
            self._texts = TokenTexts(self.gateway.tokenizer if not isinstance(self.gateway.tokenizer, str) else None)
        return self._texts

    def runs(self) -> dict[str, Any]:
        """Open rollouts first (status ``running``), then the finished ones the gateway still holds."""
        opened = [(r, snapshot(r.core.trajectory)) for r in self.gateway.registry.open_rollouts()]
        rows = [_open_row(f"{OPEN}{rollout.id}", rollout, traj) for rollout, traj in opened]
        rows += [run_row(f"{DONE}{n}", record) for n, record in self.gateway.writer.recent]
        versions = self._versions(traj for _, traj in opened)
        return runs_page(self.title, rows, audit=None, figures=[], live=True, versions=versions)

    def _versions(self, open_trajectories: Iterable[TrajectoryRecord]) -> list[str]:
        """Every weight version the page shows, open and finished rollouts alike, in order: one colour each."""
        finished = (record.trajectory for _, record in self.gateway.writer.recent)
        found = {v for traj in (*open_trajectories, *finished) for v in weight_versions(traj)}
        return sorted(found, key=version_key)

    def _find(self, key: str) -> tuple[dict[str, Any], TrajectoryRecord]:
        if key.startswith(OPEN):
            for rollout in self.gateway.registry.open_rollouts():
                if rollout.id == key[len(OPEN) :]:
                    traj = snapshot(rollout.core.trajectory)
                    return _open_fields(rollout, traj), traj
        for n, record in self.gateway.writer.recent:
            if key == f"{DONE}{n}":
                return record_fields(record), record.trajectory
        raise KeyError(key)

    def record(self, key: str) -> dict[str, Any]:
        """An open or finished rollout, token by token."""
        fields, traj = self._find(key)
        versions = self._versions(snapshot(r.core.trajectory) for r in self.gateway.registry.open_rollouts())
        return record_view(
            fields, Trajectory.from_record(traj), self.texts, image_url=lambda s: f"images/{key}/{s}", versions=versions
        )

    def image(self, key: str, sha256: str) -> tuple[bytes, str]:
        """An image of rollout ``key``."""
        return image_of(self._find(key)[1], sha256)

    def figure(self, index: int) -> Any:
        """The gateway shows no figures."""
        raise IndexError(index)


def _open_fields(rollout: GatewayRollout, traj: TrajectoryRecord) -> dict[str, Any]:
    return {
        "task_id": rollout.task_id,
        "sample": rollout.sample,
        "group": rollout.group,
        "status": "running",  # open: the client may call again (the trajectory's status is its last call's)
        "status_reason": None if traj.status == "running" else f"open (its last call: {traj.status})",
        "reward": None,
        "advantage": None,
        "turn_rewards": None,  # given at the finish
        "server": None,
        "weight_versions": None,
    }


def _open_row(key: str, rollout: GatewayRollout, traj: TrajectoryRecord) -> dict[str, Any]:
    output = sum(s.end - s.start for s in traj.segments if s.kind == "output")
    return {
        **_open_fields(rollout, traj),
        "index": key,
        "tokens": len(traj.token_ids),
        "output_tokens": output,
        "turns": model_calls(traj),  # over every branch, as a finished record's row counts them
        "tool_calls": rollout.tool_calls,
        "branches": 1 + len(traj.branches),
        "images": len(traj.media),
        "turn_tokens": [turn.output_len for turn in traj.turns],
    }
