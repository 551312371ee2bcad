"""``tito audit`` on the arithmetic example's records (examples/arithmetic on the tiny random Qwen3, float32).

The example's first call is a forced tool call (constrained decoding: its logprobs are the engine's
post-constraint ones), the next ones are free. Re-scored by a plain forward pass of the same weights, the free
turns match to float32 noise; re-scored by other weights (a checkpoint swapped under the records), they do not,
and ``--max-kl`` exits 1.
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
    """8 rollouts of the example (4 tasks x 2), seeded: a forced first call, then free calls up to 48 tokens."""
    tmp = tmp_path_factory.mktemp("audit")
    tasks = tmp / "tasks.jsonl"
    tasks.write_text("".join((EXAMPLE / "tasks.jsonl").read_text().splitlines(True)[:4]))
    overrides: dict[str, Any] = {
        "prepare": "",  # the tiny model instead of SmolLM2, as test_rollout_example does
        "tokenizer": str(qwen_tokenizer_dir("qwen3")),
        "backend_options": {"model_path": str(tiny_model_dir), "num_threads": 1},  # float32, the CPU default
        "sampling": {"temperature": 1.0, "max_new_tokens": 48, "seed": 0},
        "group_size": 2,
        "max_model_calls": 3,
    }
    out = tmp / "rollouts.jsonl"
    summary = rollout(EXAMPLE / "tito.toml", tasks, out, **overrides)
    assert summary.written == 8
    return out


def audit(records: Path, *args: str) -> tuple[int, dict[str, Any]]:
    report = records.with_name(f"report-{len(list(records.parent.glob('report-*')))}.json")
    code = main(["audit", str(records), *args, "--json", str(report)])
    return code, json.loads(report.read_text())


def test_the_same_weights_match_to_float32_noise_and_constrained_turns_are_apart(
    records: Path, tiny_model_dir: Path
) -> None:
    code, report = audit(records, "--model", str(tiny_model_dir), "--max-kl", "1e-6")
    assert code == 0 and report["records"] == 8
    free, constrained = report["free"], report["constrained"]
    assert free["tokens"] > 100 and constrained["tokens"] > 100
    assert free["max_abs"] < 1e-4 and free["k3"] < 1e-9  # float32 engine, float32 re-score
    assert 0.999 < free["ratio_p1"] <= free["ratio_p99"] < 1.001
    assert constrained["mean_diff"] < -1.0  # the grammar raised every forced token's recorded logprob
    assert {"0", "1"} <= set(report["by"]["turn"])
    assert report["by"]["turn"]["0"]["tokens"] == constrained["tokens"]  # the forced call is each first turn
    assert set(report["by"]["constrained"]) == {"constrained", "free"}
    assert set(report["by"]["finish_reason"]) <= {"stop", "length"}
    assert sum(v["tokens"] for v in report["by"]["branch"].values()) == report["all"]["tokens"]


def test_records_from_other_weights_fail_the_gate(records: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tito_testing.tiny_model import build_tiny_qwen3

    swapped = build_tiny_qwen3(seed=4321)  # a checkpoint the records were not sampled from
    code, report = audit(records, "--model", str(swapped), "--max-kl", "1e-3")
    assert code == 1
    assert "above --max-kl" in capsys.readouterr().err
    assert report["free"]["k3"] > 1e-3 and report["free"]["mean_abs"] > 0.05


def test_the_config_scores_with_its_embedded_model_and_a_sample(records: Path, tiny_model_dir: Path) -> None:
    config = records.with_name("tito.toml")
    config.write_text(f'backend = "transformers"\ntokenizer = "{tiny_model_dir}"\n[backend_options]\n'
                      f'model_path = "{tiny_model_dir}"\n')  # fmt: skip
    code, report = audit(records, "--config", str(config), "--sample", "3", "--max-kl", "1e-6")
    assert code == 0 and report["records"] == 3
    assert str(tiny_model_dir) in report["scorer"] and report["free"]["max_abs"] < 1e-4


def test_the_plot_draws_free_and_forced_turns_apart(records: Path, tiny_model_dir: Path) -> None:
    pytest.importorskip("matplotlib")
    from PIL import Image

    png = records.with_name("audit.png")
    assert main(["audit", str(records), "--model", str(tiny_model_dir), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    width, height = Image.open(png).size
    assert (width, height) == (1100, 748)  # two rows of 10 x 3.4 inches at 110 dpi: free turns, then forced ones


def test_the_report_is_shown_by_the_viewer_of_its_file_only(
    records: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from tito_core.viewer import FileSource

    code, report = audit(records, "--model", str(tiny_model_dir), "--sample", "3")
    assert code == 0 and len(report["rollouts"]) == 3
    path = records.with_name(f"report-{len(list(records.parent.glob('report-*'))) - 1}.json")
    rows = FileSource(records, audit=path).runs()["rows"]
    audited = [row for row in rows if row["audit_max_abs"] is not None]
    free = [row["audit_free_k3"] for row in audited if row["audit_free_k3"] is not None]  # None: no free turn
    assert len(audited) == 3 and free and max(free) < 1e-9


@pytest.fixture(scope="module")
def look_records(tiny_vl_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/look_agent's rollout on the tiny Qwen2.5-VL (bf16): a forced `look` call, its picture, a free answer."""
    import asyncio

    from tito_core.records import open_writer, rollout_record

    from .test_vision_agent import _example

    _, traj, _ = asyncio.run(_example().run(0, model_dir=tiny_vl_dir))
    out = tmp_path_factory.mktemp("look") / "look.jsonl"
    with open_writer(out) as writer:
        writer.write(rollout_record(traj.close(), task_id="look", sample=0, group=0, reward=None, server=None,
                                    started=0.0, wall_s=1.0, agent_s=1.0, tool_calls=1))  # fmt: skip
    return out


def test_records_with_images_are_scored_by_the_vision_model(look_records: Path, tiny_vl_dir: Path) -> None:
    code, report = audit(look_records, "--model", str(tiny_vl_dir), "--dtype", "bfloat16", "--max-kl", "1e-3")
    assert code == 0 and report["skipped"] == {}
    free = report["free"]
    print(f"free turn of the image record, bf16 re-score: {free}")
    assert free["tokens"] >= 8 and report["by"]["images"]["with images"]["tokens"] == free["tokens"]
    assert free["mean_abs"] < 5e-3 and free["max_abs"] < 2e-2  # bf16 noise (tests/integration/weight_updates.py)
    assert report["constrained"]["mean_diff"] < -1.0  # the forced `look` call: post-grammar logprobs


def test_the_vision_scorer_is_a_plain_forward_pass_with_the_picture(look_records: Path, tiny_vl_dir: Path) -> None:
    """Its pixel inputs and 3-D positions (the embedded backend's) give what transformers computes on its own."""
    import asyncio

    from tito_core.analysis.audit import TransformersScorer
    from tito_core.records import read_records
    from tito_core.trajectory import Trajectory

    from .test_vision_agent import _rescore

    traj = Trajectory.from_record(next(iter(read_records(look_records))).trajectory)
    scorer = TransformersScorer(tiny_vl_dir, dtype="bfloat16")
    assert scorer.takes_images
    scored = asyncio.run(scorer.score(traj.token_ids, traj.prompt_media()))
    plain = _rescore(tiny_vl_dir, traj)
    gap = max(abs(a - b) for a, b in zip(scored[1:], plain[1:], strict=True))
    print(f"vision scorer against a plain forward pass: max |diff| {gap:.3g}")
    assert gap < 1e-4  # the same computation (measured: 0): far below bf16 noise


TOOL_MODULE = '''
from strands import tool


@tool
def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return str(a + b)
'''


def test_drift_rebuilds_the_text_stack_and_counts_what_changes(tmp_path: Path, tiny_model_dir: Path) -> None:
    """``--drift``: each rollout as a text stack holds it, re-rendered and re-tokenized, against the recorded ids."""
    (tmp_path / "tiny_tools.py").write_text(TOOL_MODULE)
    config = tmp_path / "tito.toml"
    config.write_text(
        f"""backend = "transformers"
tokenizer = "{tiny_model_dir}"
tool_parser = "hermes"

[backend_options]
model_path = "{tiny_model_dir}"
dtype = "float32"
num_threads = 1

[sampling]
temperature = 1.0
max_new_tokens = 24
seed = 0

[rollout]
group_size = 2
tools = ["tiny_tools:add"]
forced_tool_calls = 1
max_model_calls = 2
"""
    )
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t0", "prompt": "Add 2 and 3.", "answer": "5"}) + "\n")
    records = tmp_path / "rollouts.jsonl"
    assert rollout(config, tasks, records).written == 2
    code, report = audit(records, "--config", str(config), "--drift")  # no gate: the forced call may be all there is
    assert code == 0 and report["records"] == 2
    assert report["constrained"]["tokens"] > 0 and report["constrained"]["max_abs"] > 5.0
    drift = report["drift"]
    assert drift["compared"] == 2 and not drift["skipped"]
    assert drift["mask"]["trained_tokens"] == report["all"]["tokens"]
    # the random model's forced call is valid JSON the parser reads back: the stack writes it its own way
    assert drift["different_ids"] == 2 and drift["spans_by_category"]
