"""A bubblewrap sandbox per rollout, with a Harbor task's file layout.

Each rollout gets a folder on the host (under the system's temporary folder) holding what its sandbox may write:
the working directory (the task's ``environment/`` files, its Docker files left out), ``/logs`` (Harbor's
``agent/`` and ``verifier/``), ``/tmp`` (with ``HOME`` in it) and, for the verifier only, ``/tests``. Every
command runs under ``bwrap`` (Debian's ``bubblewrap``) with those bound writable and the host's own folders bound
read-only: the harness and the verifier run on the host's programs, not on an image built from the task's
Dockerfile.

What it isolates: files (a rollout writes only its own folders; other rollouts' folders, the host's ``/tmp``,
every task folder of the dataset, with its tests and solution, and the credentials in the runner's home
(:data:`SECRETS`) are not visible), processes (a PID namespace: the
sandbox sees only its own, so not another harness's environment or token), IPC and the host name, and the
environment (cleared: only ``PATH``, ``HOME``, ``LANG``, the task's and the agent's variables). When the
runner kills the command, bwrap and everything in the sandbox die with it.
What it does not: the network (shared with the host, so the gateway on loopback is reachable, and so is
anything else the host can reach; a harness reaches its own rollout only, by its token), resource limits
(``[environment].cpus`` / ``memory_mb`` are not enforced), and the user (the runner's own).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import TitoError
from .tasks import HarborSpec

__all__ = ["DOCKER_FILES", "Sandbox", "SandboxError", "bwrap"]

DOCKER_FILES = frozenset({"Dockerfile", ".dockerignore", "docker-compose.yaml", "docker-compose.yml"})
"""Files of ``environment/`` that describe an image: not copied into the working directory."""

_NOT_BOUND = frozenset({"proc", "dev", "sys", "tmp", "run", "logs", "tests"})
"""Top-level host folders the sandbox does not see (it gets its own ``/proc``, ``/dev``, ``/tmp``, ``/logs``)."""

SECRETS: tuple[str, ...] = (".ssh", ".aws", ".gnupg", ".config", ".docker", ".kube", ".codex", ".claude")  # folders
SECRETS += (".netrc", ".git-credentials", ".pypirc", ".npmrc")  # files
"""Entries of the runner's home a sandbox sees empty: credentials and tools' settings (the rest of the host is
read-only but readable, so a harness finds the programs installed there)."""

HOME = "/tmp/home"
"""``HOME`` inside the sandbox: in its own ``/tmp``, so a harness's config and caches stay in its rollout."""


class SandboxError(TitoError):
    """The sandbox could not be made or started (no ``bwrap``, a task folder that cannot be copied)."""


def bwrap() -> str:
    """The path of ``bwrap``, or a :class:`SandboxError` saying how to install it."""
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxError("the Harbor sandbox needs bubblewrap: `apt-get install bubblewrap` (no `bwrap` on PATH)")
    return found


class Sandbox:
    """One rollout's sandbox: its folder on the host, and the ``bwrap`` command lines that run in it.

    Args:
        root: The rollout's folder on the host (made by :meth:`create`).
        spec: The task.
        hide: Host folders masked by an empty one inside (the dataset folder: its tests and solutions).
    """

    def __init__(self, root: Path, spec: HarborSpec, *, hide: Sequence[str | Path] = ()) -> None:
        self.root = root
        self.spec = spec
        self.hide = [Path(p) for p in hide]
        self.work, self.logs, self.tmp, self.tests = root / "work", root / "logs", root / "tmp", root / "tests"

    @classmethod
    def create(cls, spec: HarborSpec, *, name: str = "rollout", hide: Sequence[str | Path] = ()) -> Sandbox:
        """A fresh sandbox folder for one rollout of ``spec``'s task, its working directory filled.

        Raises:
            SandboxError: No ``bwrap``, or the task's files cannot be copied.
        """
        bwrap()
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80]
        root = Path(tempfile.mkdtemp(prefix=f"tito-harbor-{safe}-"))
        box = cls(root, spec, hide=hide)
        try:
            environment = Path(spec.task_dir) / "environment"
            if environment.is_dir():
                ignore = shutil.ignore_patterns(*DOCKER_FILES)
                shutil.copytree(environment, box.work, symlinks=True, ignore=ignore)
            else:
                box.work.mkdir()
            for folder in (
                box.logs / "agent",
                box.logs / "verifier",
                box.logs / "artifacts",
                box.tmp / "home",
                box.tests,
            ):
                folder.mkdir(parents=True)
        except OSError as exc:
            box.remove()
            raise SandboxError(f"cannot make the sandbox of {spec.task_dir}: {exc}") from exc
        return box

    def argv(self, command: Sequence[str], *, verifier: bool = False, cwd: str | None = None) -> list[str]:
        """The ``bwrap`` command line running ``command`` in this sandbox; run it with :meth:`environ`'s variables.

        The variables go through bwrap's own environment, not its command line, where any process of the host
        could read a rollout's token. ``verifier``: ``/tests`` is bound too (the agent never sees the tests).
        ``cwd``: where the command starts (default: the working directory).
        """
        workdir = self.spec.workdir
        top = Path(workdir).parts[1]  # the host folder the working directory would land in is not bound
        args = [bwrap(), "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--hostname", "tito-sandbox"]
        for entry in sorted(os.listdir("/")):
            path = Path("/") / entry
            if entry in _NOT_BOUND or entry == top:
                continue
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                args += ["--ro-bind", str(path), str(path)]
        home = Path.home()
        for name in SECRETS:
            secret = home / name
            if secret.is_dir() and not secret.is_symlink():
                args += ["--tmpfs", str(secret)]
            elif secret.is_file():
                args += ["--ro-bind", "/dev/null", str(secret)]
        for hidden in self.hide:
            if hidden.is_dir() and hidden.parts[1] not in _NOT_BOUND and hidden.parts[1] != top:
                args += ["--tmpfs", str(hidden)]
        args += ["--proc", "/proc", "--dev", "/dev", "--bind", str(self.tmp), "/tmp"]
        args += ["--bind", str(self.logs), "/logs", "--bind", str(self.work), workdir]
        if verifier:
            args += ["--bind", str(self.tests), "/tests"]
        return [*args, "--chdir", cwd or workdir, "--", *command]

    def host_path(self, path: str) -> Path:
        """The host path behind ``path`` inside the sandbox.

        Only the working directory, ``/logs``, ``/tmp`` and ``/tests`` have one: the places a sandbox writes.

        Raises:
            SandboxError: ``path`` is elsewhere (the host's own folders are read-only inside).
        """
        inside = Path(os.path.normpath(path))
        mounts = {Path(self.spec.workdir): self.work, Path("/logs"): self.logs, Path("/tmp"): self.tmp}
        mounts[Path("/tests")] = self.tests
        for target, source in mounts.items():
            if inside == target or inside.is_relative_to(target):
                return source / inside.relative_to(target)
        raise SandboxError(f"{path}: not a writable place of the sandbox (its working directory, /logs, /tmp, /tests)")

    @staticmethod
    def environ(env: Mapping[str, str]) -> dict[str, str]:
        """The whole environment of a sandboxed command: ``env`` and ``HOME`` (no other host variable)."""
        return {**env, "HOME": HOME}

    def stage_tests(self) -> None:
        """Copy the task's ``tests/`` to the sandbox's ``/tests`` afresh, and remove any reward file already there.

        A reward file the agent wrote itself is not the verifier's.
        """
        shutil.rmtree(self.tests, ignore_errors=True)
        shutil.copytree(Path(self.spec.task_dir) / "tests", self.tests, symlinks=True)
        for name in ("reward.txt", "reward.json"):
            (self.logs / "verifier" / name).unlink(missing_ok=True)

    def remove(self) -> None:
        """Delete the sandbox's folder."""
        shutil.rmtree(self.root, ignore_errors=True)


def base_env() -> dict[str, str]:
    """The host variables a sandboxed command keeps: ``PATH`` and the locale."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM")
    return {key: os.environ[key] for key in keep if key in os.environ} | {"LANG": os.environ.get("LANG", "C.UTF-8")}
