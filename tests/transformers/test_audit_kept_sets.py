"""``tito audit`` on records sampled with top-p 0.9 and top-k 20 (the arithmetic example, tiny Qwen3, float32).

The embedded backend recorded each token's kept set and its logprob over it. Re-scored over the same kept sets,
the records match to float32 noise (the forced turns too: their grammar's mask is part of each kept set); re-scored
over the whole vocabulary, the common mistake, every token is off by its log S, so the ratios sit below 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tito_core import rollout
from tito_core.cli import main
from tito_testing.tokenizers import qwen_tokenizer_dir

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "arithmetic"


@pytest.fixture(scope="module")
def records(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("audit-kept")
    tasks = tmp / "tasks.jsonl"
    tasks.write_text("".join((EXAMPLE / "tasks.jsonl").read_text().splitlines(True)[:2]))
    overrides: dict[str, Any] = {
        "prepare": "",
        "tokenizer": str(qwen_tokenizer_dir("qwen3")),
        "backend_options": {"model_path": str(tiny_model_dir), "num_threads": 1},
        "sampling": {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "max_new_tokens": 48, "seed": 0},
        "group_size": 2,
        "max_model_calls": 3,
    }
    out = tmp / "rollouts.jsonl"
    assert rollout(EXAMPLE / "tito.toml", tasks, out, **overrides).written == 4
    return out


def test_audit_with_the_kept_sets_matches_and_without_them_shows_log_s(records: Path, tiny_model_dir: Path) -> None:
    report_path = records.with_name("report.json")
    code = main(["audit", str(records), "--model", str(tiny_model_dir), "--max-kl", "1e-6", "--json", str(report_path)])
    report = json.loads(report_path.read_text())
    assert code == 0
    kept, full = report["kept_sets"], report["kept_sets_full_vocabulary"]
    assert kept["tokens"] == full["tokens"] == report["all"]["tokens"] > 50  # every trained token had a kept set
    assert kept["max_abs"] < 1e-4 and report["constrained"]["max_abs"] < 1e-4  # the same weights, float32 noise
    assert full["mean_diff"] < -0.05 and full["ratio_p99"] <= 1.0 + 1e-6  # log S <= 0 at every token
    assert full["ratio_p1"] < 0.9
