"""The viewer's JSON API and its rules, over a real local socket (aiohttp's server, aiohttp's client).

What the page draws from this data is tests/browser's (a real Chromium).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tito_core.cli import main
from tito_core.viewer import FileSource, browser_rules, viewer_app
from tito_testing.tokenizers import qwen_tokenizer_dir

from ..helpers.viewer_rollouts import IMAGE_PADS, png, write_audit, write_rollouts


@pytest.fixture(scope="module")
def rollouts(qwen3_tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_rollouts(tmp_path_factory.mktemp("view") / "rollouts.jsonl", qwen3_tokenizer)


async def serve(source: Any, **options: Any) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(viewer_app(source, **options))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def viewer(rollouts: Path, qwen3_tokenizer: Any) -> AsyncIterator[str]:
    runner, url = await serve(FileSource(rollouts, qwen3_tokenizer))
    yield url
    await runner.cleanup()


async def get(url: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        return response.status, dict(response.headers), await response.read()


async def test_the_runs_page_lists_every_record_with_its_figures(viewer: str) -> None:
    status, headers, body = await get(f"{viewer}/api/runs")
    data = json.loads(body)
    assert status == 200 and data["title"] == "rollouts.jsonl" and data["live"] is False
    rows = {row["task_id"]: row for row in data["rows"]}
    assert list(rows) == ["calc", "look", "fork", "broken"] and [r["index"] for r in data["rows"]] == list("0123")
    assert data["statuses"] == {"completed": 2, "truncated": 1, "failed": 1}
    assert rows["calc"]["weight_versions"] == "1..2" and rows["calc"]["turns"] == 2
    assert rows["fork"]["branches"] == 2 and rows["look"]["images"] == 1
    assert rows["fork"]["turns"] == 3  # 2 calls in branch 0, 1 of branch 1's own (its first is branch 0's, kept)
    assert data["versions"] == ["1", "2"]  # the file's versions, in order: one colour each on every page
    assert rows["broken"]["status_reason"] == "the engine refused the request: 400 bad request"
    assert rows["broken"]["turn_tokens"] == [] and len(rows["calc"]["turn_tokens"]) == 2
    assert {g["task_id"]: g["rewards"] for g in data["groups"]} == {"calc": [1.0], "look": [1.0], "fork": [0.0]}
    assert headers["X-Frame-Options"] == "DENY" and "default-src 'none'" in headers["Content-Security-Policy"]


async def test_a_record_is_every_token_with_its_kind_text_logprob_version_and_turn(viewer: str, rollouts: Path) -> None:
    from tito_core.records import read_records

    record = next(iter(read_records(rollouts)))
    status, _, body = await get(f"{viewer}/api/records/0")
    view = json.loads(body)
    (branch,) = view["branches"]
    traj = record.trajectory
    assert status == 200 and view["decoded"] is True and view["turn_rewards"] == [0.25, 1.0]
    assert branch["ids"] == traj.token_ids and branch["logprobs"] == traj.logprobs
    mask = [1 if kind == "o" else 0 for kind in branch["kinds"]]
    assert len(branch["kinds"]) == len(traj.token_ids) and set(branch["kinds"]) == {"p", "o", "b"}
    from tito_core.trajectory import Trajectory

    assert mask == Trajectory.from_record(traj).loss_mask
    assert "".join(branch["texts"]).startswith("<|im_start|>system\nYou add.")
    assert "".join(t for t, k in zip(branch["texts"], branch["kinds"], strict=True) if k == "o").startswith(
        "<tool_call>"
    )
    turns = branch["turns"]
    assert [t["constrained"] for t in turns] == [True, False] and turns[0]["versions"][0][2] == "1"
    versions = {v for v, k in zip(branch["versions"], branch["kinds"], strict=True) if k == "o"}
    assert versions == {"1", "2"} and branch["deltas"] is None


async def test_an_image_is_at_its_span_and_served_as_recorded(viewer: str) -> None:
    _, _, body = await get(f"{viewer}/api/records/1")
    (branch,) = json.loads(body)["branches"]
    (image,) = branch["images"]
    assert image["length"] == IMAGE_PADS and image["size"] == [56, 40]
    assert set(branch["texts"][image["start"] : image["start"] + IMAGE_PADS]) == {"<|image_pad|>"}
    status, headers, data = await get(f"{viewer}/{image['url']}")
    assert status == 200 and data == png() and headers["Content-Type"] == "image/png"
    assert (await get(f"{viewer}/images/1/{'0' * 64}"))[0] == 404
    assert (await get(f"{viewer}/images/9/{image['sha256']}"))[0] == 404


async def test_branches_carry_their_fork(viewer: str) -> None:
    _, _, body = await get(f"{viewer}/api/records/2")
    first, second = json.loads(body)["branches"]
    assert (first["branch"], first["parent"], second["branch"], second["parent"]) == (0, None, 1, 0)
    assert second["fork_reason"] == "the client rewrote the history" and second["status"] == "truncated"
    assert (second["fork_kind"], second["label"], first["fork_kind"], first["label"]) == ("rewrite", "main", None, None)
    assert second["ids"][: second["fork_at"]] == first["ids"][: second["fork_at"]]
    shared = next(i for i, (a, b) in enumerate(zip(first["ids"], second["ids"], strict=False)) if a != b)
    assert second["shared"] == shared > second["fork_at"]  # the re-rendered prompt shares more than the fork kept
    assert first["shared"] == 0
    assert "once more, louder" in "".join(second["texts"]) and "once more" not in "".join(first["texts"])


async def test_the_page_script_and_style_ship_and_nothing_else_is_served(viewer: str) -> None:
    status, headers, page = await get(f"{viewer}/")
    assert status == 200 and b'src="static/viewer.js"' in page and headers["Content-Type"].startswith("text/html")
    for name, kind in (("viewer.js", "text/javascript"), ("viewer.css", "text/css")):
        status, headers, _ = await get(f"{viewer}/static/{name}")
        assert status == 200 and headers["Content-Type"].startswith(kind)
    for name in ("", "static/viewer.js", "static/viewer.css"):  # offline: no address but SVG's namespace name
        urls = set(re.findall(rb"(?:https?:)?//[\w.-]+", (await get(f"{viewer}/{name}"))[2]))
        assert urls <= {b"http://www.w3.org"}, (name, urls)
    for path in ("/static/..%2F__init__.py", "/static/pages.py", "/api/records/99", "/api/records/x", "/nope"):
        status, headers, _ = await get(viewer + path)
        assert status == 404 and headers["X-Content-Type-Options"] == "nosniff", path
    async with aiohttp.ClientSession() as session, session.post(f"{viewer}/api/runs", json={}) as response:
        assert response.status == 405  # read-only


async def test_a_foreign_host_or_a_web_page_is_refused(rollouts: Path) -> None:
    runner, url = await serve(FileSource(rollouts), refuse=None)
    port = url.rsplit(":", 1)[1]
    await runner.cleanup()
    refuse = browser_rules(frozenset({f"127.0.0.1:{port}", f"localhost:{port}"}))
    runner = web.AppRunner(viewer_app(FileSource(rollouts), refuse=refuse))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", int(port))
    await site.start()
    try:
        assert (await get(f"{url}/api/runs"))[0] == 200
        assert (await get(f"{url}/api/runs", Origin=url))[0] == 200  # the page itself
        status, _, body = await get(f"{url}/api/runs", Host="evil.example:80")  # DNS rebinding
        assert status == 403 and b"not this viewer's address" in body
        status, _, body = await get(f"{url}/api/runs", Origin="http://evil.example")
        assert status == 403 and b"other web pages" in body
    finally:
        await runner.cleanup()


async def test_without_a_tokenizer_the_pages_show_ids(rollouts: Path) -> None:
    runner, url = await serve(FileSource(rollouts))
    try:
        view = json.loads((await get(f"{url}/api/records/0"))[2])
        assert view["decoded"] is False and view["branches"][0]["texts"] is None
    finally:
        await runner.cleanup()


@pytest.fixture
def report(rollouts: Path, tmp_path: Path) -> Path:
    """A real report of the file (made before the test's event loop runs): calc's tokens 0.5 off, the rest exact."""
    return write_audit(rollouts, tmp_path / "audit.json", lambda task, i: 0.5 if task == "calc" else 0.0)


async def test_a_per_token_audit_is_drawn_on_the_record_it_names(rollouts: Path, report: Path) -> None:
    from tito_core.records import read_records

    first = next(iter(read_records(rollouts)))
    runner, url = await serve(FileSource(rollouts, audit=report))
    try:
        runs = json.loads((await get(f"{url}/api/runs"))[2])
        assert runs["audit"]["scorer"] == "test scorer"
        rows = {row["task_id"]: row for row in runs["rows"]}
        assert rows["calc"]["audit_max_abs"] == 0.5 and rows["look"]["audit_max_abs"] == 0.0
        assert rows["calc"]["audit_free_k3"] > 0.0 and rows["broken"]["audit_max_abs"] is None  # nothing scored
        deltas = json.loads((await get(f"{url}/api/records/0"))[2])["branches"][0]["deltas"]
        mask = [
            lp is not None and k == "output" for lp, k in zip(first.trajectory.logprobs, _kinds(first), strict=True)
        ]
        assert [d is not None for d in deltas] == mask and {d for d in deltas if d is not None} == {0.5}
        assert json.loads((await get(f"{url}/api/records/1"))[2])["branches"][0]["deltas"][-1] == 0.0
    finally:
        await runner.cleanup()


def _kinds(record: Any) -> list[str]:
    kinds = [""] * len(record.trajectory.token_ids)
    for segment in record.trajectory.segments:
        kinds[segment.start : segment.end] = [segment.kind] * (segment.end - segment.start)
    return kinds


def test_the_command_refuses_a_non_loopback_host_and_bad_files(
    rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["view", str(rollouts), "--host", "0.0.0.0"]) == 2
    assert "serves on loopback only" in capsys.readouterr().err
    assert main(["view", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such rollout file" in capsys.readouterr().err
    (tmp_path / "not.png").write_text("x")
    assert main(["view", str(rollouts), "--figure", str(tmp_path / "not.png")]) == 2
    assert "not a PNG file" in capsys.readouterr().err
    (tmp_path / "report.json").write_text("{}")
    assert main(["view", str(rollouts), "--audit", str(tmp_path / "report.json"), "--tokenizer",
                 str(qwen_tokenizer_dir("qwen3"))]) == 2  # fmt: skip
    assert "not a `tito audit --json` report" in capsys.readouterr().err


@pytest.fixture
def parquet(qwen3_tokenizer: Any, tmp_path: Path) -> Path:
    return write_rollouts(tmp_path / "rollouts.parquet", qwen3_tokenizer)


async def test_a_parquet_output_and_its_images_folder_are_read_alike(qwen3_tokenizer: Any, parquet: Path) -> None:
    runner, url = await serve(FileSource(parquet, qwen3_tokenizer))
    try:
        rows = json.loads((await get(f"{url}/api/runs"))[2])["rows"]
        assert [r["task_id"] for r in rows] == ["calc", "look", "fork", "broken"]
        (image,) = json.loads((await get(f"{url}/api/records/1"))[2])["branches"][0]["images"]
        assert (await get(f"{url}/{image['url']}"))[2] == png()
    finally:
        await runner.cleanup()


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """`tito view` run in-process up to where it would serve (the sources it would serve are kept)."""
    import tito_core.cli.view as view

    sources: list[Any] = []

    async def no_serving(source: Any, host: str, port: int) -> int:
        sources.append(source)
        return 0

    monkeypatch.setattr(view, "_serve", no_serving)
    return sources


@pytest.fixture
def no_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tokenizer load fails the test: a bad input must be refused before it."""
    import tito_core.cli.view as view

    def loaded(args: Any) -> None:
        raise AssertionError("the tokenizer was loaded before the bad input was refused")

    monkeypatch.setattr(view, "decoding_tokenizer", loaded)


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def view(path: Path, *args: str) -> int:
    return main(["view", str(path), "--tokenizer", str(qwen_tokenizer_dir("qwen3")), *args])


def test_a_malformed_line_is_named_by_its_number(
    rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_tokenizer: None
) -> None:
    lines = rollouts.read_bytes().splitlines(keepends=True)
    bad = rollouts.with_name("bad.jsonl")
    bad.write_bytes(b"".join([*lines[:2], b'{"task_id": "x", "sample": 0, "oops"\n', *lines[2:]]))
    assert view(bad) == 2
    assert one_line_error(capsys).startswith(f"tito view: error: {bad}: line 3 is not a rollout record: ")
    assert main(["inspect", str(bad)]) == 2  # the same reader: the same line
    assert one_line_error(capsys).startswith(f"tito inspect: error: {bad}: line 3 is not a rollout record: ")


def test_a_partial_last_line_is_skipped_aloud(
    rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], served: list[Any]
) -> None:
    torn = rollouts.with_name("torn.jsonl")  # beside it: the lines name their pictures' files relative to it
    torn.write_bytes(rollouts.read_bytes() + b'{"task_id": "half", "sam')
    assert view(torn) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"tito view: {torn}: skipped 1 partial last line (24 bytes without a newline: a run still "
                      "writing it, or one killed mid-write)")  # fmt: skip
    assert re.fullmatch(r"tito view: 4 records read in [\d.]+ s; tokenizer loaded in [\d.]+ s", err[1]), err
    assert len(served[0].records) == 4


@pytest.mark.parametrize("newline", [b"", b"\n"])
async def test_a_trajectory_file_is_shown_as_a_record(rollouts: Path, tmp_path: Path, newline: bytes) -> None:
    """`tito demo` and examples/look_agent save one trajectory (Trajectory.to_json, no newline at its end)."""
    from tito_core.records import read_records
    from tito_core.trajectory import Trajectory

    look = list(read_records(rollouts))[1]
    path = tmp_path / "tito-demo-trajectory.json"
    path.write_bytes(Trajectory.from_record(look.trajectory).to_json() + newline)
    runner, url = await serve(FileSource(path))
    try:
        (row,) = json.loads((await get(f"{url}/api/runs"))[2])["rows"]
        assert (row["task_id"], row["status"], row["images"], row["turns"]) == ("look:0", "completed", 1, 2)
        (branch,) = json.loads((await get(f"{url}/api/records/0"))[2])["branches"]
        assert branch["ids"] == look.trajectory.token_ids
        assert (await get(f"{url}/{branch['images'][0]['url']}"))[2] == png()
    finally:
        await runner.cleanup()


def test_the_command_says_it_shows_a_trajectory_file(
    rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], served: list[Any]
) -> None:
    from tito_core.records import read_records
    from tito_core.trajectory import Trajectory

    path = tmp_path / "trajectory.json"
    path.write_bytes(Trajectory.from_record(next(iter(read_records(rollouts))).trajectory).to_json())
    assert view(path) == 0
    assert "1 records read" in capsys.readouterr().err and served[0].records[0].task_id == "calc:0"


def test_an_empty_file_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str], no_tokenizer: None) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert view(empty) == 2
    assert one_line_error(capsys) == f"tito view: error: {empty}: no rollout records in it: nothing to show"


@pytest.fixture
def altered(rollouts: Path, tmp_path: Path) -> Path:
    """The same four records, but ``calc:0`` holds ``look:0``'s tokens."""
    import msgspec

    from tito_core.records import open_writer, read_records

    calc, look, *rest = read_records(rollouts)
    path = tmp_path / "altered.jsonl"
    with open_writer(path) as writer:
        for record in (msgspec.structs.replace(calc, trajectory=look.trajectory), look, *rest):
            writer.write(record)
    return path


def test_an_audit_report_of_other_records_is_refused(
    rollouts: Path, altered: Path, report: Path, capsys: pytest.CaptureFixture[str], no_tokenizer: None
) -> None:
    assert view(altered, "--audit", str(report)) == 2
    assert one_line_error(capsys) == (f"tito view: error: --audit {report}: made from other records: rollout "
                                      "'calc:0' has other tokens in altered.jsonl")  # fmt: skip
    empty_of_calc = rollouts.with_name("others.jsonl")
    empty_of_calc.write_bytes(b"".join(rollouts.read_bytes().splitlines(keepends=True)[1:]))
    assert view(empty_of_calc, "--audit", str(report)) == 2
    assert one_line_error(capsys) == (f"tito view: error: --audit {report}: made from other records: it scored "
                                      "rollout 'calc:0', which others.jsonl does not hold")  # fmt: skip
    old = altered.with_name("old.json")
    old.write_text(json.dumps({k: v for k, v in json.loads(report.read_text()).items() if k != "rollouts"}))
    assert view(rollouts, "--audit", str(old)) == 2
    assert "does not say which records it scored" in one_line_error(capsys)


def test_records_of_another_tokenizer_are_refused(
    rollouts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], served: list[Any]
) -> None:
    import msgspec

    from tito_core.records import open_writer, read_records

    first = next(iter(read_records(rollouts)))
    ids = [*first.trajectory.token_ids[:-1], 200_000]  # another model's vocabulary
    foreign = tmp_path / "foreign.jsonl"
    with open_writer(foreign) as writer:
        writer.write(
            msgspec.structs.replace(first, trajectory=msgspec.structs.replace(first.trajectory, token_ids=ids))
        )
    assert view(foreign) == 2
    assert one_line_error(capsys) == (f"tito view: error: --tokenizer {qwen_tokenizer_dir('qwen3')}: the records "
                                      "hold token id 200000, beyond its 151669 tokens: they were not made with this "
                                      "tokenizer")  # fmt: skip
