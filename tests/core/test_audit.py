"""The mismatch ledger (tito_core.analysis.audit) on hand-built records and a scorer whose answers are known.

The scorer here returns the recorded logprobs plus a chosen offset per token, so every statistic and every
breakdown has an exact expected value. The real re-score (a transformers forward pass, an engine's score route)
is tests/transformers/test_audit.py's.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec
import pytest

from tito_core.analysis.audit import AuditReport, Ledger, audit, gap_stats
from tito_core.cli import main
from tito_core.media import Image, MediaSpan, PromptMedia
from tito_core.records import RolloutRecord, open_writer, rollout_record
from tito_core.trajectory import Trajectory, Turn, Usage
from tito_core.versions import VersionSpan
from tito_testing.tokenizers import qwen_tokenizer_dir


def png() -> bytes:
    from PIL import Image as PILImage

    out = io.BytesIO()
    PILImage.new("RGB", (28, 28), (200, 10, 10)).save(out, format="png")
    return out.getvalue()


class OffsetScorer:
    """Scores each sequence as ``old[i] + offset(ids, i)`` from a table of recorded logprobs by prefix."""

    takes_images = False
    description = "offset scorer"

    def __init__(self, table: dict[tuple[int, ...], list[float | None]], offset: Callable[[int], float]) -> None:
        self.table, self.offset, self.calls = table, offset, 0

    async def score(self, token_ids: Sequence[int]) -> list[float | None]:
        self.calls += 1
        ids = tuple(token_ids)
        for full, old in self.table.items():
            if full[: len(ids)] == ids:
                return [None if lp is None else lp + self.offset(token) for lp, token in zip(old, ids, strict=False)]
        raise AssertionError(f"unknown sequence {ids}")


def turn(index: int, start: int, prompt: int, output: int, **fields: object) -> Turn:
    usage = Usage(prompt_tokens=start + prompt, completion_tokens=output)
    return Turn(index=index, rid=f"r{index}", prompt_start=start, prompt_len=prompt, output_len=output,
                finish_reason="stop", stop_reason="end_turn", usage=usage, **fields)  # type: ignore[arg-type]  # fmt: skip


def two_turns(*, constrained: bool = False) -> Trajectory:
    """Prompt 1-3, output 10-12 (turn 0, version v1), tool result 4-5, output 20-21 (turn 1, version v2)."""
    traj = Trajectory("t:0")
    traj.append("prompt", [1, 2, 3], turn=0)
    traj.append("output", [10, 11, 12], [-0.5, -1.0, -0.25], turn=0)
    traj.add_turn(
        turn(0, 0, 3, 3, constrained=constrained, weight_versions=(VersionSpan(version="v1", start=0, end=3),))
    )
    traj.append("prompt", [4, 5], turn=1)
    traj.append("output", [20, 21], [-2.0, -0.125], turn=1)
    traj.add_turn(turn(1, 6, 2, 2, weight_versions=(VersionSpan(version="v2", start=0, end=2),)))
    traj.close("completed")
    return traj


def record_of(traj: Trajectory, server: str = "http://a") -> RolloutRecord:
    return rollout_record(traj, task_id="t", sample=0, group=0, reward=1.0, server=server, started=0.0, wall_s=1.0,
                          agent_s=1.0, tool_calls=1)  # fmt: skip


def table_of(*trajs: Trajectory) -> dict[tuple[int, ...], list[float | None]]:
    return {tuple(b.token_ids): b.logprobs for t in trajs for b in t.all_branches}


def test_the_stats_of_known_gaps() -> None:
    stats = gap_stats([0.0, 0.1, -0.1, 0.5])
    assert stats.tokens == 4
    assert stats.mean_abs == pytest.approx(0.175)
    assert stats.max_abs == 0.5
    assert stats.mean_diff == pytest.approx(0.125)
    assert stats.k3 == pytest.approx(sum(math.expm1(r) - r for r in (0.0, 0.1, -0.1, 0.5)) / 4)
    assert (stats.ratio_p1, stats.ratio_p99) == (pytest.approx(math.exp(-0.1)), pytest.approx(math.exp(0.5)))
    assert gap_stats([]).tokens == 0 and math.isnan(gap_stats([]).k3)


def test_an_exact_re_score_has_no_gap_and_a_shifted_one_is_measured() -> None:
    traj = two_turns()
    exact = asyncio.run(audit([record_of(traj)], OffsetScorer(table_of(traj), lambda token: 0.0)))
    assert exact.all.tokens == 5 and exact.all.max_abs == 0.0 and exact.all.k3 == 0.0
    assert exact.all.ratio_p1 == exact.all.ratio_p99 == 1.0
    shifted = asyncio.run(audit([record_of(traj)], OffsetScorer(table_of(traj), lambda token: 0.25 * (token >= 20))))
    assert shifted.all.tokens == 5 and shifted.all.max_abs == pytest.approx(0.25)
    assert shifted.by["turn"]["0"].max_abs == 0.0 and shifted.by["turn"]["1"].mean_abs == pytest.approx(0.25)
    assert set(shifted.by["weight_version"]) == {"v1", "v2"}
    assert shifted.by["weight_version"]["v2"].tokens == 2
    assert shifted.by["server"]["http://a"].tokens == 5 and shifted.by["finish_reason"]["stop"].tokens == 5


def test_constrained_turns_are_reported_apart_from_the_free_ones() -> None:
    traj = two_turns(constrained=True)
    report = asyncio.run(audit([record_of(traj)], OffsetScorer(table_of(traj), lambda token: -3.0 * (token < 20))))
    assert report.constrained.tokens == 3 and report.constrained.max_abs == pytest.approx(3.0)
    assert report.free.tokens == 2 and report.free.max_abs == 0.0 and report.free.k3 == 0.0
    assert set(report.by["constrained"]) == {"constrained", "free"}
    assert list(report.by["constrained_turn"]) == ["0"] and list(report.by["free_turn"]) == ["1"]  # the plot's rows
    assert report.by["constrained_turn"]["0"].tokens == 3 and report.by["free_turn"]["1"].max_abs == 0.0


def test_each_rollout_has_its_own_figures_and_its_records_fingerprint() -> None:
    from tito_core.records import rollout_digest

    calm, off = two_turns(), two_turns(constrained=True)
    records = [record_of(calm), msgspec.structs.replace(record_of(off), sample=1)]
    report = asyncio.run(audit(records, OffsetScorer(table_of(calm), lambda token: 0.5 * (token == 21))))
    assert set(report.rollouts) == {"t:0", "t:1"}
    assert report.rollouts["t:0"].digest == rollout_digest(records[0])
    assert report.rollouts["t:0"].all.max_abs == 0.5 and report.rollouts["t:0"].free.tokens == 5
    assert report.rollouts["t:1"].free.tokens == 2  # its first turn is constrained
    assert rollout_digest(records[0]) == rollout_digest(records[1])  # the same tokens
    assert rollout_digest(record_of(with_an_image())) != rollout_digest(records[0])


def test_a_forked_branch_files_only_its_own_tokens() -> None:
    traj = Trajectory("t:0")
    traj.append("prompt", [1, 2, 3], turn=0)
    traj.append("output", [10, 11], [-0.5, -1.0], turn=0)
    traj.add_turn(turn(0, 0, 3, 2))
    traj.append("prompt", [4], turn=1)
    traj.append("output", [20], [-2.0], turn=1)
    traj.add_turn(turn(1, 5, 1, 1))
    child = traj.fork(5, "a rewritten history")  # keeps the first call
    child.append("prompt", [6, 7], turn=1)
    child.append("output", [30, 31], [-0.75, -0.5], turn=1)
    child.add_turn(turn(1, 5, 2, 2))
    child.close("completed")
    scorer = OffsetScorer(table_of(child), lambda token: 0.0)
    report = asyncio.run(audit([record_of(child)], scorer))
    assert report.branches == 2 and scorer.calls == 2
    assert report.all.tokens == 2 + 1 + 2  # the shared first output once, each branch's own after it
    assert report.by["branch"]["0"].tokens == 3 and report.by["branch"]["1"].tokens == 2
    assert {k: v.tokens for k, v in report.by["lineage"].items()} == {"root": 3, "fork": 2}  # no kind: made by hand
    child.label = "sub-agent"  # a client's label names the lineage in the breakdown
    relabelled = asyncio.run(audit([record_of(child)], OffsetScorer(table_of(child), lambda token: 0.0)))
    assert {k: v.tokens for k, v in relabelled.by["lineage"].items()} == {"root": 3, "sub-agent": 2}


def with_an_image() -> Trajectory:
    """Prompt 1-2, output 10-11 (turn 0), an image's placeholders 7 7 7 and text 8, output 20-21 (turn 1)."""
    traj = Trajectory("t:0")
    traj.append("prompt", [1, 2], turn=0)
    traj.append("output", [10, 11], [-0.5, -1.0], turn=0)
    traj.add_turn(turn(0, 0, 2, 2))
    traj.append("prompt", [7, 7, 7, 8], turn=1)  # an image's placeholders, then text
    image = Image(png())
    span = MediaSpan(
        start=4, length=3, sha256=image.sha256, format="png", size=image.size, grid_thw=(1, 2, 2), placeholder_id=7
    )
    traj.add_media([PromptMedia(span=span, item=image)])
    traj.append("output", [20, 21], [-2.0, -0.5], turn=1)
    traj.add_turn(turn(1, 4, 4, 2))
    return traj.close("completed")


def test_tokens_after_an_image_are_not_scored_by_a_text_only_scorer() -> None:
    traj = with_an_image()
    scorer = OffsetScorer(table_of(traj), lambda token: 0.0)
    report = asyncio.run(audit([record_of(traj)], scorer))
    assert report.all.tokens == 2  # the first output; the second follows the image
    assert report.skipped == {"trained tokens after an image (the scorer takes no images)": 2}


def test_per_token_gaps_sit_at_their_positions_for_the_viewer() -> None:
    traj = two_turns()
    scorer = OffsetScorer(table_of(traj), lambda token: 0.5 if token == 20 else 0.0)
    report = asyncio.run(audit([record_of(traj)], scorer, per_token=True))
    assert report.tokens == {"t:0": {"0": [None, None, None, 0.0, 0.0, 0.0, None, None, 0.5, 0.0]}}
    assert json.loads(report.to_json())["tokens"]["t:0"]["0"][8] == 0.5
    assert asyncio.run(audit([record_of(traj)], scorer)).tokens is None  # only when asked: it is large


def test_the_report_is_json_with_null_for_an_empty_selection() -> None:
    traj = two_turns()
    ledger = Ledger(OffsetScorer(table_of(traj), lambda token: 0.0))
    asyncio.run(ledger.add(record_of(traj)))
    data = json.loads(ledger.report().to_json())
    assert data["constrained"]["tokens"] == 0 and data["constrained"]["k3"] is None
    assert data["free"]["tokens"] == 5 and data["by"]["turn"]["1"]["tokens"] == 2
    assert isinstance(ledger.report(), AuditReport)


def test_the_command_refuses_bad_options_and_a_backend_that_cannot_score(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rollouts.jsonl"
    with open_writer(out) as writer:
        writer.write(record_of(two_turns()))
    assert main(["audit", str(out), "--model", "x", "--max-kl", "-1"]) == 2
    assert "--max-kl must be a non-negative number" in capsys.readouterr().err
    config = tmp_path / "tito.toml"
    tok = qwen_tokenizer_dir("qwen3")
    config.write_text(f'backend = "scripted"\ntokenizer = "{tok}"\n[backend_options]\ntokenizer = "{tok}"\n')
    assert main(["audit", str(out), "--config", str(config)]) == 2
    assert "cannot score a token sequence" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: one of --model and --config is required
        main(["audit", str(out)])


@pytest.fixture
def offset_scorer(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tito audit`` scores with an exact :class:`OffsetScorer` of the file's records, built where the real one is."""
    import tito_core.cli.audit as cli_audit

    async def exact(args, config, records):
        return OffsetScorer(table_of(*(Trajectory.from_record(r.trajectory) for r in records)), lambda t: 0.0), None

    monkeypatch.setattr(cli_audit, "_scorer", exact)


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model load (or an engine built from the config) fails the test: a bad input is refused before it."""
    import tito_core.analysis.audit as audit_module
    from tito_core.config import TitoConfig

    def loaded(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the bad input was refused")

    monkeypatch.setattr(audit_module, "TransformersScorer", loaded)
    monkeypatch.setattr(TitoConfig, "create_backend", loaded)


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def written(path: Path, *trajs: Trajectory) -> Path:
    with open_writer(path) as writer:
        for sample, traj in enumerate(trajs):
            writer.write(msgspec.structs.replace(record_of(traj), sample=sample))
    return path


def test_a_gate_with_nothing_to_check_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], offset_scorer: None
) -> None:
    forced = Trajectory("t:0")  # a record whose only turn is constrained: no free-turn token
    forced.append("prompt", [1, 2, 3], turn=0)
    forced.append("output", [10, 11], [-0.5, -1.0], turn=0)
    forced.add_turn(turn(0, 0, 3, 2, constrained=True))
    out = written(tmp_path / "forced.jsonl", forced.close("completed"))
    assert main(["audit", str(out), "--model", "unused", "--max-kl", "1"]) == 1
    assert "no free-turn token was scored" in capsys.readouterr().err
    assert main(["audit", str(out), "--model", "unused"]) == 0  # no gate: a report of constrained tokens only


def test_a_malformed_line_is_named_by_its_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_model: None
) -> None:
    out = written(tmp_path / "rollouts.jsonl", two_turns())
    out.write_bytes(out.read_bytes() + b"[1, 2]\n")
    assert main(["audit", str(out), "--model", "m"]) == 2
    assert one_line_error(capsys).startswith(f"tito audit: error: {out}: line 2 is not a rollout record: Expected")


def test_an_empty_file_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str], no_model: None) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["audit", str(empty), "--model", "m"]) == 2
    assert one_line_error(capsys) == f"tito audit: error: {empty}: no rollout records in it: nothing to audit"


def test_a_partial_last_line_is_skipped_aloud_and_the_rest_audited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], offset_scorer: None
) -> None:
    out = written(tmp_path / "rollouts.jsonl", two_turns())
    out.write_bytes(out.read_bytes() + b'{"task_id": "t", "sam')
    assert main(["audit", str(out), "--model", "m", "--json", str(tmp_path / "r.json")]) == 0
    assert capsys.readouterr().err.startswith(f"tito audit: {out}: skipped 1 partial last line (21 bytes")
    assert json.loads((tmp_path / "r.json").read_text())["records"] == 1


def test_a_trajectory_file_is_audited(tmp_path: Path, offset_scorer: None) -> None:
    """`tito demo` saves one trajectory (Trajectory.to_json, no newline at its end): it is audited as a record."""
    path = tmp_path / "tito-demo-trajectory.json"
    path.write_bytes(two_turns().to_json())
    assert main(["audit", str(path), "--model", "m", "--json", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["records"] == 1 and report["all"]["tokens"] == 5 and list(report["rollouts"]) == ["t:0:0"]


def test_the_outputs_are_checked_before_any_scoring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_model: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = written(tmp_path / "rollouts.jsonl", two_turns())
    missing = tmp_path / "no-such-folder" / "report.json"
    assert main(["audit", str(out), "--model", "m", "--json", str(missing)]) == 2
    assert one_line_error(capsys) == (f"tito audit: error: --json {missing}: its folder "
                                      f"{str(missing.parent)!r} does not exist")  # fmt: skip
    assert main(["audit", str(out), "--model", "m", "--json", str(tmp_path)]) == 2
    assert one_line_error(capsys) == f"tito audit: error: --json {tmp_path}: a folder, not a file to write"
    assert main(["audit", str(out), "--model", "m", "--plot", str(tmp_path / "plot.txt")]) == 2
    assert one_line_error(capsys) == f"tito audit: error: --plot {tmp_path / 'plot.txt'}: name a .png, .svg, .pdf file"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    assert main(["audit", str(out), "--model", "m", "--plot", str(tmp_path / "plot.png")]) == 2
    assert one_line_error(capsys).startswith(
        'tito audit: error: --plot needs matplotlib: pip install "tito-core[plot]"'
    )


def test_a_model_that_cannot_score_the_records_is_refused_before_it_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_model: None
) -> None:
    out = written(tmp_path / "rollouts.jsonl", two_turns())
    assert main(["audit", str(out), "--model", str(tmp_path / "nowhere")]) == 2
    assert one_line_error(capsys) == f"tito audit: error: --model {tmp_path / 'nowhere'}: no such model directory"
    model = tmp_path / "model"
    model.mkdir()
    assert main(["audit", str(out), "--model", str(model)]) == 2
    assert one_line_error(capsys) == (f"tito audit: error: --model {model}: not a model directory (config.json: "
                                      "No such file or directory)")  # fmt: skip
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 16}))
    assert main(["audit", str(out), "--model", str(model)]) == 2  # the records hold id 21: another tokenizer's
    assert one_line_error(capsys) == (f"tito audit: error: these records were not made with the tokenizer of the "
                                      f"llama model at {model}: they hold token id 21, beyond its vocabulary of 16 "
                                      "ids")  # fmt: skip


def test_records_with_images_need_a_scorer_that_sees_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_model: None
) -> None:
    out = written(tmp_path / "rollouts.jsonl", with_an_image(), two_turns())
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": 64}))
    assert main(["audit", str(out), "--model", str(model)]) == 2
    assert one_line_error(capsys) == (f"tito audit: error: 1 record has images, and the qwen3 model at {model} takes "
                                      "none: audit them with the vision model they were made with (--model its "
                                      "directory, or a --config whose backend_options.model_path is it)")  # fmt: skip
    config = tmp_path / "tito.toml"
    tok = qwen_tokenizer_dir("qwen3")
    config.write_text(f'backend = "scripted"\ntokenizer = "{tok}"\n[backend_options]\ntokenizer = "{tok}"\n')
    assert main(["audit", str(out), "--config", str(config)]) == 2
    assert one_line_error(capsys).startswith("tito audit: error: 1 record has images, and the scripted engine's score "
                                             "route takes none")  # fmt: skip
