"""The bubblewrap sandbox on its own: what a command inside can see and write of the host."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tito_core.harbor import HarborSpec, Sandbox

from .helpers import make_task

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed: `nox -s harbor`")


def run(box: Sandbox, script: str) -> subprocess.CompletedProcess[str]:
    env = box.environ({"PATH": "/usr/bin:/bin"})
    return subprocess.run(box.argv(["bash", "-c", script]), env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def home() -> Iterator[Path]:
    """A runner's home the sandbox would see (under /var/tmp: the host's /tmp is replaced inside)."""
    folder = Path(tempfile.mkdtemp(prefix="tito-home-", dir="/var/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_runners_credentials_are_hidden_and_the_host_is_read_only(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    (home / ".netrc").write_text("machine example.com password hunter2")
    (home / "notes.txt").write_text("readable")
    monkeypatch.setenv("HOME", str(home))
    task = make_task(tmp_path / "tasks", "t", "Do it.", "exit 0")
    box = Sandbox.create(HarborSpec(task_dir=str(task)), name="t")
    try:
        listing = run(box, f"cat {home}/notes.txt; ls -A {home}/.ssh; cat {home}/.netrc; echo end")
        assert "readable" in listing.stdout  # the home is there, read-only: its credentials are not
        assert "id_ed25519" not in listing.stdout and "hunter2" not in listing.stdout
        wrote = run(box, "echo x > /usr/tito-probe; echo x > /app/inside && echo wrote-inside")
        assert "wrote-inside" in wrote.stdout and not Path("/usr/tito-probe").exists()
        assert (box.work / "inside").read_text() == "x\n"  # the working directory is the rollout's own folder
    finally:
        box.remove()
    assert not box.root.exists()
