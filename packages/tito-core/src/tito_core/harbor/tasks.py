"""Harbor task folders as tito tasks, read and validated by the ``harbor`` package itself.

``harbor.models.task.task.Task`` parses ``task.toml`` (its schema, its defaults), checks that the folder holds an
``instruction.md`` and a test script, strips canary lines from the instruction and resolves ``${VAR}`` templates
in the environment tables (``harbor.utils.env.resolve_env_vars``): tito uses it rather than a reader of its own so
that a task Harbor accepts is the task tito runs. What a rollout needs from it is kept in the task's metadata as a
:class:`HarborSpec` (``metadata["harbor"]``), so a task crosses to a worker process as plain data.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import msgspec

from ..errors import DatasetError

__all__ = ["HARBOR_KEY", "HarborSpec", "HarborTask", "harbor_spec", "load_harbor_tasks"]

HARBOR_KEY = "harbor"
"""The key of a Harbor task's :class:`HarborSpec` in the runner task's ``metadata``."""

DEFAULT_WORKDIR = "/app"
"""The working directory when ``task.toml`` names none: the ``WORKDIR`` of Harbor's task template."""


class HarborSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a rollout of one Harbor task needs: where its files are, its limits and its variables.

    Attributes:
        task_dir: The task folder (absolute).
        workdir: The working directory inside the sandbox (``[environment].workdir``, else ``/app``).
        agent_timeout_s: ``[agent].timeout_sec`` (None: the runner's own limits only).
        verifier_timeout_s: ``[verifier].timeout_sec``.
        env: ``[environment].env``, templates resolved: set for the agent and the verifier.
        verifier_env: ``[verifier].env``, templates resolved: set for the verifier only.
        hide: Host folders the sandbox masks: every task folder of the dataset (their tests and solutions).
    """

    task_dir: str
    workdir: str = DEFAULT_WORKDIR
    agent_timeout_s: float | None = None
    verifier_timeout_s: float = 600.0
    env: dict[str, str] = msgspec.field(default_factory=dict)
    verifier_env: dict[str, str] = msgspec.field(default_factory=dict)
    hide: list[str] = msgspec.field(default_factory=list)


class HarborTask(msgspec.Struct, frozen=True, kw_only=True):
    """One Harbor task as read: its id, its instruction (the prompt), its :class:`HarborSpec` and its position.

    The runner makes a task of its own from it, the spec in its metadata (``metadata[HARBOR_KEY]``).
    """

    id: str
    prompt: str
    spec: HarborSpec
    index: int = 0


class _WithMetadata(Protocol):
    @property
    def metadata(self) -> Mapping[str, Any]: ...


def harbor_spec(task: _WithMetadata) -> HarborSpec | None:
    """The :class:`HarborSpec` in a runner task's metadata (None for a task that is not a Harbor task)."""
    spec = task.metadata.get(HARBOR_KEY)
    if spec is None:
        return None
    return spec if isinstance(spec, HarborSpec) else msgspec.convert(spec, HarborSpec)


def load_harbor_tasks(path: str | os.PathLike[str]) -> list[HarborTask]:
    """Read one Harbor task folder, or every task folder (one holding ``task.toml``) directly under ``path``.

    Tasks are ordered by folder name; a task's id is its ``[task].name``, else its folder's name.

    Raises:
        DatasetError: ``harbor`` is not installed, the path holds no task, a task is invalid (harbor's reason),
            is multi-step or targets Windows (the sandbox runs Linux tasks), or two tasks share an id.
    """
    root = Path(path).resolve()
    if not root.is_dir():
        raise DatasetError(f"{root}: Harbor dataset folder not found")
    if (root / "task.toml").is_file():
        folders = [root]
    else:
        folders = sorted(p for p in root.iterdir() if (p / "task.toml").is_file())
    if not folders:
        raise DatasetError(f"{root}: no Harbor task here (a task folder holds task.toml; a dataset, task folders)")
    hidden = [str(folder) for folder in folders]  # every task folder, not the dataset's: the config may live there
    tasks: list[HarborTask] = []
    seen: dict[str, Path] = {}
    for index, folder in enumerate(folders):
        task = _task(folder, index, hide=hidden)
        if task.id in seen:
            raise DatasetError(f"{folder}: task name {task.id!r} repeats {seen[task.id]}")
        seen[task.id] = folder
        tasks.append(task)
    return tasks


def _task(folder: Path, index: int, *, hide: list[str]) -> HarborTask:
    harbor_task, resolve_env_vars = _harbor()
    try:
        read: Any = harbor_task(folder)
        config = read.config
        if read.has_steps:
            raise DatasetError(f"{folder}: a multi-step Harbor task ([[steps]]) is not supported yet")
        if str(getattr(config.environment.os, "value", config.environment.os)) != "linux":
            raise DatasetError(f"{folder}: [environment].os must be linux: the sandbox runs Linux tasks")
        spec = HarborSpec(
            task_dir=str(read.task_dir),
            workdir=config.environment.workdir or DEFAULT_WORKDIR,
            agent_timeout_s=config.agent.timeout_sec,
            verifier_timeout_s=float(config.verifier.timeout_sec),
            env=dict(resolve_env_vars(config.environment.env)),
            verifier_env=dict(resolve_env_vars(config.verifier.env)),
            hide=hide,
        )
    except DatasetError:
        raise
    except Exception as exc:  # harbor raises pydantic, OS, value and runtime errors for a bad task
        raise DatasetError(f"{folder}: not a valid Harbor task: {type(exc).__name__}: {exc}") from exc
    if not spec.workdir.startswith("/") or spec.workdir == "/":
        raise DatasetError(f"{folder}: [environment].workdir must be an absolute folder below /, not {spec.workdir!r}")
    return HarborTask(id=str(read.name), prompt=str(read.instruction), spec=spec, index=index)


def _harbor() -> tuple[Any, Any]:
    """Harbor's ``Task`` class and its ``resolve_env_vars``, or a :class:`DatasetError` saying how to get them."""
    try:
        from harbor.models.task.task import Task as HarborTask
        from harbor.utils.env import resolve_env_vars
    except ImportError as exc:
        raise DatasetError(
            f"Harbor tasks are read with the `harbor` package (Python 3.12+): `pip install harbor` ({exc})"
        ) from exc
    return HarborTask, resolve_env_vars
