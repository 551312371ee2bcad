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

from ..helpers.viewer_rollouts import IMAGE_PADS, png, write_rollouts


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
    assert second["ids"][: second["fork_at"]] == first["ids"][: second["fork_at"]]
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


async def test_a_per_token_audit_is_drawn_on_the_record_it_names(rollouts: Path, tmp_path: Path) -> None:
    from tito_core.records import read_records

    ids = next(iter(read_records(rollouts))).trajectory.token_ids
    deltas = [None] * len(ids)
    deltas[-2] = 0.5
    report = tmp_path / "audit.json"
    report.write_text(json.dumps({"scorer": "s", "free": {"tokens": 1}, "tokens": {"calc:0": {"0": deltas}}}))
    runner, url = await serve(FileSource(rollouts, audit=report))
    try:
        runs = json.loads((await get(f"{url}/api/runs"))[2])
        assert runs["audit"]["scorer"] == "s"
        assert json.loads((await get(f"{url}/api/records/0"))[2])["branches"][0]["deltas"] == deltas
        assert json.loads((await get(f"{url}/api/records/1"))[2])["branches"][0]["deltas"] is None
    finally:
        await runner.cleanup()


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
