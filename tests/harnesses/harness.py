"""Running a coding CLI against a gateway rollout on the scripted backend, and what every harness test checks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tito_core.config import TitoConfig
from tito_core.gateway import Gateway
from tito_core.gateway.registry import GatewayRollout
from tito_core.trajectory import Trajectory
from tito_testing.scripted import ScriptedBackend
from tito_testing.tokenizers import qwen_tokenizer_dir


async def run_cli(
    tokenizer: Any,
    replies: list[str],
    cwd: Path,
    launch: Callable[[GatewayRollout], tuple[list[str], dict[str, str]]],
) -> tuple[Trajectory, str, str, int]:
    """Run ``launch(rollout)``'s command (its argv and environment) against a fresh rollout whose model answers
    ``replies``; returns the closed trajectory, its stdout, its stderr and its exit code."""
    backend = ScriptedBackend(tokenizer, replies)
    config = TitoConfig(backend="scripted", tokenizer=str(qwen_tokenizer_dir("qwen3")), tool_parser="hermes")
    gateway = Gateway(config, tokenizer=tokenizer, backend=backend)
    await gateway.start()
    try:
        rollout = gateway.open(task_id="harness")
        command, env = launch(rollout)
        process = await asyncio.create_subprocess_exec(
            *command, env=env, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), timeout=300)
        traj = await gateway.take(rollout.id)
    finally:
        await gateway.close()
    return traj, out.decode(), err.decode(), int(process.returncode or 0)


def check_tool_loop(traj: Trajectory, tokenizer: Any, said: str, output: str) -> None:
    """Two turns on one branch, completed, and the command's ``output`` in the second prompt's tool result."""
    assert traj.branch == 0 and not traj.branches and len(traj.turns) == 2, (traj.branches, said[-2000:])
    assert traj.status == "completed", traj.status_reason
    second = traj.turns[1]
    prompt = tokenizer.decode(traj.token_ids[second.prompt_start : second.prompt_start + second.prompt_len])
    assert output in prompt.split("<tool_response>", 1)[-1]  # the command the harness ran, its output sent back
