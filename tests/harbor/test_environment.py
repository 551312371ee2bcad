"""tito's bubblewrap sandbox as a Harbor environment (``tito_core.harbor.environment:BubblewrapEnvironment``),
loaded by Harbor's own factory from its import path, driven by Harbor's own ``Verifier``: the example tasks get
the rewards Harbor computes (1 once solved, 0 unsolved), with the task's files in the working directory and the
verifier's logs downloaded to the trial folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .helpers import DATASET

pytest.importorskip("harbor", reason="the harbor package (Python 3.12+): run `nox -s harbor`")
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed: `nox -s harbor`")
IMPORT_PATH = "tito_core.harbor.environment:BubblewrapEnvironment"


async def verified(task_name: str, tmp_path: Path, solve: str | None) -> dict[str, float | int] | None:
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths
    from harbor.verifier.verifier import Verifier

    task = Task(DATASET / task_name)
    paths = TrialPaths(tmp_path / "trial")
    paths.mkdir()
    environment = EnvironmentFactory.get_environment_class(import_path=IMPORT_PATH)(
        environment_dir=task.paths.environment_dir,
        environment_name=task.name,
        session_id=f"{task.name}__test",
        trial_paths=paths,
        task_env_config=task.config.environment,
    )
    await environment.start(force_build=False)
    try:
        listing = await environment.exec("ls")
        assert listing.return_code == 0 and "Dockerfile" not in (listing.stdout or "")
        if solve is not None:
            done = await environment.exec(solve)
            assert done.return_code == 0, done.stderr
        result = await Verifier(task, paths, environment).verify()
    finally:
        await environment.stop(delete=True)
    assert (paths.verifier_dir / "test-stdout.txt").exists()  # downloaded by Harbor's verifier
    return result.rewards


async def test_harbors_verifier_rewards_a_solved_task_1_in_the_sandbox(tmp_path: Path) -> None:
    assert await verified("fix-add", tmp_path, "sed -i 's/a - b/a + b/' calc.py") == {"reward": 1.0}


async def test_harbors_verifier_rewards_an_unsolved_task_0_in_the_sandbox(tmp_path: Path) -> None:
    assert await verified("fix-add", tmp_path, None) == {"reward": 0.0}
    assert await verified("impossible", tmp_path / "2", "echo yes > answer.txt") == {"reward": 0.0}


async def test_uploads_outside_the_sandbox_are_refused(tmp_path: Path) -> None:
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    from tito_core.harbor import SandboxError

    task = Task(DATASET / "write-greeting")
    environment = EnvironmentFactory.get_environment_class(import_path=IMPORT_PATH)(
        environment_dir=task.paths.environment_dir, environment_name=task.name, session_id="s",
        trial_paths=TrialPaths(tmp_path), task_env_config=task.config.environment,
    )  # fmt: skip
    await environment.start(force_build=False)
    try:
        with pytest.raises(SandboxError, match="/etc/passwd: not a writable place"):
            await environment.upload_file(DATASET / "write-greeting" / "instruction.md", "/etc/passwd")
        wrote = await environment.exec("echo x > /etc/tito-probe")
        assert wrote.return_code != 0 and not Path("/etc/tito-probe").exists()  # the host is read-only inside
    finally:
        await environment.stop(delete=True)
