"""tito's bubblewrap sandbox as a Harbor environment: a ``BaseEnvironment`` subclass Harbor loads by import path.

Harbor's environments are plug-ins (``harbor.environments.base.BaseEnvironment``, named by ``import_path`` in a
job's environment config); this one runs Harbor's own trial steps (the verifier uploading ``tests/``, running
``test.sh`` and downloading ``/logs/verifier``; an agent's ``exec`` calls) in a
:class:`~tito_core.harbor.sandbox.Sandbox`, with the same layout and isolation as ``tito rollout``'s Harbor tasks.
Commands run as the runner's user (``user`` is ignored: there is no root inside). Only the sandbox's working
directory, ``/logs``, ``/tmp`` and ``/tests`` take uploads. Importing this module needs ``harbor`` (Python 3.12+).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities

from .sandbox import Sandbox, SandboxError, base_env, bwrap
from .tasks import DEFAULT_WORKDIR, HarborSpec

__all__ = ["BubblewrapEnvironment"]


class BubblewrapEnvironment(BaseEnvironment):
    """A Harbor environment running each command in one tito bubblewrap sandbox (made by ``start``)."""

    _box: Sandbox | None = None

    @staticmethod
    def type() -> str:
        """Harbor's name for this environment type."""
        return "tito-bubblewrap"

    @property
    def capabilities(self) -> Any:
        """None of Harbor's optional capabilities: no GPUs, no network policy, no host mounts, no compose."""
        return EnvironmentCapabilities()

    def _validate_definition(self) -> None:
        """``bwrap`` is installed and the working directory is absolute."""
        bwrap()
        if self.task_env_config.workdir is not None and not self.task_env_config.workdir.startswith("/"):
            raise ValueError(f"[environment].workdir must be absolute, not {self.task_env_config.workdir!r}")

    @property
    def box(self) -> Sandbox:
        """The started sandbox."""
        if self._box is None:
            raise SandboxError("the environment is not started")
        return self._box

    async def start(self, force_build: bool) -> None:
        """Make the sandbox: the task's ``environment/`` files (no image is built) in its working directory."""
        spec = HarborSpec(
            task_dir=str(Path(self.environment_dir).parent),
            workdir=self.task_env_config.workdir or DEFAULT_WORKDIR,
            hide=[str(Path(self.environment_dir).parent)],
        )
        self._box = await asyncio.to_thread(Sandbox.create, spec, name=self.session_id, hide=spec.hide)

    async def stop(self, delete: bool) -> None:
        """Delete the sandbox's folder (with ``delete``; else keep it to look at)."""
        if self._box is not None and delete:
            await asyncio.to_thread(self._box.remove)
            self._box = None

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> Any:
        """Run ``command`` with bash in the sandbox (``/tests`` bound), within ``timeout_sec``."""
        box = self.box
        environ = box.environ({**base_env(), **(self._merge_env(env) or {})})
        process = await asyncio.create_subprocess_exec(
            *box.argv(["bash", "-c", command], verifier=True, cwd=cwd),
            env=environ,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            async with asyncio.timeout(timeout_sec):
                out, err = await process.communicate()
        finally:
            if process.returncode is None:  # timed out or cancelled: bwrap's group, and the sandbox with it
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        code = process.returncode
        return ExecResult(stdout=out.decode(errors="replace"), stderr=err.decode(errors="replace"), return_code=code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Copy a host file to a writable place of the sandbox."""
        target = self.box.host_path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(shutil.copy2, source_path, target)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copy a host folder into a writable place of the sandbox (merged with what is there)."""
        target = self.box.host_path(target_dir)
        await asyncio.to_thread(shutil.copytree, source_dir, target, symlinks=True, dirs_exist_ok=True)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        """Copy a file of the sandbox's writable places to the host."""
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(shutil.copy2, self.box.host_path(source_path), target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy a folder of the sandbox's writable places to the host (merged with what is there)."""
        source = self.box.host_path(source_dir)
        await asyncio.to_thread(shutil.copytree, source, target_dir, symlinks=True, dirs_exist_ok=True)
