"""The ``[rollout.tasks]`` table (Harbor tasks) is checked before any work: what it needs and what it refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tito_core import rollout
from tito_core.errors import ConfigError, DatasetError

from .helpers import config


def harbor(**rollout_keys: Any) -> dict[str, Any]:
    built = config(["unused"])
    built["rollout"] = {"tasks": {"harbor": "tasks"}, **rollout_keys}
    return built


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        ({}, r"`rollout\.tasks\.harbor` runs a harness in a sandbox: it needs `\[rollout\.agent\]` with a `command`"),
        ({"agent": {"command": ["mini"]}, "reward": "r:r"}, r"`rollout\.reward` with .*verifier is the reward"),
        ({"agent": {"command": ["mini"]}, "tasks": {"harbour": "x"}}, r"unknown key `rollout\.tasks\.harbour`"),
        ({"agent": {"command": ["mini"]}, "tasks": {}}, r"`rollout\.tasks` needs `harbor`"),
    ],
)
def test_a_bad_tasks_table_is_a_config_error(tmp_path: Path, keys: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        rollout(harbor(**keys), None, tmp_path / "out.jsonl")


def test_no_dataset_and_no_tasks_table_names_both(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"no dataset: give one \(`--dataset`\), or a Harbor dataset"):
        rollout(config(["unused"]), None, tmp_path / "out.jsonl")
