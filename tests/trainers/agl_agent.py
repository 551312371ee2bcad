"""An agent class for Agent Lightning's local runner: the calculator agent, rolled out by tito."""

from __future__ import annotations

from tito_core import Trajectory
from tito_core.trainers.agentlightning import rollout_agent
from tito_testing.tokenizers import load_qwen_tokenizer

from .helpers import solve

TRAJECTORIES: list[Trajectory] = []
"""What each run produced, for the test to compare with the store."""


@rollout_agent
async def Solve(task):
    """Answer ``task["question"]`` with one calculator call; reward 1 when the scripted answer is right."""
    traj = await solve(load_qwen_tokenizer("qwen3"), task["question"], task["expression"], task["answer"])
    TRAJECTORIES.append(traj)
    return traj, 1.0 if task["answer"] == str(eval(task["expression"])) else 0.0
