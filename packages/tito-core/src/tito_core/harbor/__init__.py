"""Harbor tasks under ``tito rollout``: a task source, a bubblewrap sandbox per rollout, the task's verifier as reward.

A Harbor task is a folder with ``instruction.md`` (the prompt), ``task.toml`` (timeouts, environment variables,
the working directory), ``environment/`` (how to build its machine) and ``tests/test.sh`` (the verifier, which
writes ``/logs/verifier/reward.txt`` or ``reward.json``). :func:`load_harbor_tasks` reads a folder of them with
the ``harbor`` package's own ``Task`` (Python 3.12+); each rollout then runs the ``[rollout.agent]`` command in a
:class:`~tito_core.harbor.sandbox.Sandbox` of its own, and the verifier after it in the same sandbox
(:mod:`tito_core.harbor.verifier`). docs/harbor.md says what the sandbox isolates and what it does not.
"""

from __future__ import annotations

from .sandbox import Sandbox, SandboxError
from .tasks import HARBOR_KEY, HarborSpec, HarborTask, harbor_spec, load_harbor_tasks
from .verifier import Verdict, read_reward

__all__ = [
    "HARBOR_KEY", "HarborSpec", "HarborTask", "Sandbox", "SandboxError", "Verdict", "harbor_spec", "load_harbor_tasks",
    "read_reward",
]  # fmt: skip
