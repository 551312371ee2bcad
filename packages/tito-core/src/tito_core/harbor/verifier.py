"""The task's verifier as the reward: ``tests/test.sh`` run after the agent in its sandbox, its reward file read.

Harbor's ``Verifier`` reads ``/logs/verifier/reward.json`` when it exists (an object of finite numbers), else
``reward.txt`` (one finite number); an empty or unparsable file, or neither file, is an error, never a reward.
:func:`read_reward` follows the same rules (``tests/harbor`` checks it against harbor's own parser) and takes the
rollout's reward from ``reward.json``'s ``reward`` key, or its only key. A verifier that did not run, ran out of
time or wrote no readable reward gives a :class:`Verdict` with ``reward = None`` and the reason: never 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
from pathlib import Path

import msgspec

from .sandbox import Sandbox, base_env

__all__ = ["Verdict", "read_reward", "verify"]

OUTPUT_KEPT = 2000
"""Characters of the verifier's output a reason quotes (its tail)."""


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """What the verifier decided about one rollout.

    Attributes:
        reward: The reward (None when the verifier gave none: see ``reason``).
        rewards: Every reward of ``reward.json`` (``{"reward": x}`` for ``reward.txt``).
        reason: Why there is no reward (None when there is one).
    """

    reward: float | None
    rewards: dict[str, float] = msgspec.field(default_factory=dict)
    reason: str | None = None


def read_reward(verifier_dir: Path) -> Verdict:
    """The reward in ``verifier_dir`` (the sandbox's ``/logs/verifier``), by Harbor's rules."""
    json_path, text_path = verifier_dir / "reward.json", verifier_dir / "reward.txt"
    path = json_path if json_path.exists() else text_path
    if not path.exists():
        return Verdict(reward=None, reason="the verifier wrote no reward file (/logs/verifier/reward.txt or .json)")
    text = path.read_text(errors="replace")
    if not text.strip():
        return Verdict(reward=None, reason=f"the verifier's reward file {path.name} is empty")
    if path is text_path:
        try:
            value = float(text)
        except ValueError:
            return Verdict(reward=None, reason=f"reward.txt is not a number: {text[:80]!r}")
        rewards = {"reward": value}
    else:
        try:
            data = json.loads(text)
        except ValueError:
            return Verdict(reward=None, reason=f"reward.json is not JSON: {text[:80]!r}")
        if not isinstance(data, dict) or not data:
            return Verdict(reward=None, reason=f"reward.json must be an object of rewards: {text[:80]!r}")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in data.values()):
            return Verdict(reward=None, reason=f"reward.json holds a value that is not a number: {text[:80]!r}")
        rewards = {str(k): float(v) for k, v in data.items()}
    if not all(math.isfinite(v) for v in rewards.values()):
        return Verdict(reward=None, rewards=rewards, reason=f"{path.name} holds a reward that is not finite")
    if "reward" in rewards:
        return Verdict(reward=rewards["reward"], rewards=rewards)
    if len(rewards) == 1:
        return Verdict(reward=next(iter(rewards.values())), rewards=rewards)
    reason = f"reward.json has several rewards and no `reward` key: {text[:80]}"
    return Verdict(reward=None, rewards=rewards, reason=reason)


async def verify(box: Sandbox) -> Verdict:
    """Run the task's ``tests/test.sh`` in ``box`` and read its reward.

    It runs from the working directory, its output to ``/logs/verifier/test-stdout.txt``, within
    ``[verifier].timeout_sec``.
    """
    try:
        box.stage_tests()
    except OSError as exc:
        return Verdict(reward=None, reason=f"the verifier did not run: cannot stage tests/: {exc}")
    if not (box.tests / "test.sh").is_file():
        return Verdict(reward=None, reason="the verifier did not run: the task has no tests/test.sh")
    (box.tests / "test.sh").chmod(0o755)
    env = {**base_env(), **box.spec.env, **box.spec.verifier_env}
    shell = ["/bin/sh", "-c", "/tests/test.sh > /logs/verifier/test-stdout.txt 2>&1"]
    process = await asyncio.create_subprocess_exec(
        *box.argv(shell, verifier=True),
        env=box.environ(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(box.spec.verifier_timeout_s):
            _, err = await process.communicate()
    except TimeoutError:
        return Verdict(reward=None, reason=f"the verifier timed out after {box.spec.verifier_timeout_s:g} s")
    finally:
        if process.returncode is None:  # bwrap leads its own group; what it runs dies with it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    verdict = read_reward(box.logs / "verifier")
    if verdict.reason is not None:
        output = (
            (box.logs / "verifier" / "test-stdout.txt").read_text(errors="replace")
            if (box.logs / "verifier" / "test-stdout.txt").exists()
            else ""
        )
        tail = (output + err.decode(errors="replace"))[-OUTPUT_KEPT:].strip()
        verdict = msgspec.structs.replace(
            verdict, reason=f"{verdict.reason}; exit code {process.returncode}; output tail: {tail or '(none)'}"
        )
    return verdict
