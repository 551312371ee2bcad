"""`tito view` in a real browser: Debian's headless Chromium driven by Playwright (`nox -s browser`).

The command runs as users run it (a subprocess serving a rollout file on a free loopback port); the checks read
what the page drew: the runs table and its charts, the loss mask's classes, the hover details, the picture at
its span, the branch tree, the version bands and the audit heat map. Each page is also photographed and the
photo must not be blank (``TITO_SCREENSHOTS=DIR`` keeps them: docs/viewer.md's pictures).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tito_testing.tokenizers import qwen_tokenizer_dir

from ..helpers.viewer_rollouts import IMAGE_PADS, write_rollouts

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (nox -s browser installs it)")
CHROMIUM = os.environ.get("TITO_CHROMIUM", "/usr/bin/chromium")
SHOTS = os.environ.get("TITO_SCREENSHOTS")


def start(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    """``tito view ARGS --port 0``; the process and the address it printed once serving."""
    proc = subprocess.Popen([sys.executable, "-m", "tito_core.cli", "view", *args, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the line: no sleeping, no polling
    if "serving on" not in line:
        proc.kill()
        raise AssertionError(f"tito view did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    return proc, line.rsplit(" ", 1)[1].strip()


def served(args: list[str]) -> Iterator[str]:
    """``tito view ARGS`` for a fixture: its address, then a clean stop on SIGTERM."""
    proc, url = start(args)
    yield url
    proc.terminate()
    assert proc.wait(timeout=30) == 0


def chromium() -> Iterator[Any]:
    """Chromium for a fixture (skipped without one). A fixture using it must depend on every fixture that runs an
    event loop of its own (asyncio.run): Playwright's sync API holds one while it runs."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (nox -s browser installs Debian's; TITO_CHROMIUM names another)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def files(qwen3_tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("browser")
    rollouts = write_rollouts(tmp / "rollouts.jsonl", qwen3_tokenizer)
    from tito_core.records import read_records

    first = next(iter(read_records(rollouts)))
    deltas: list[float | None] = [None] * len(first.trajectory.token_ids)
    out_start = first.trajectory.segments[1].start
    for k, i in enumerate(range(out_start, out_start + 12)):
        deltas[i] = 10.0 ** (-6 + k / 2)  # 1e-6 .. ~3e-1: the heat map's whole scale
    report = tmp / "audit.json"
    report.write_text(json.dumps({"scorer": "test scorer", "records": 1, "free": {"tokens": 12, "mean_abs": 0.05,
                                  "max_abs": 0.3, "k3": 0.01}, "tokens": {"calc:0": {"0": deltas}}}))  # fmt: skip
    figure = tmp / "figure.png"
    from PIL import Image

    Image.new("RGB", (120, 60), (40, 120, 200)).save(figure)
    return {"rollouts": rollouts, "audit": report, "figure": figure}


@pytest.fixture(scope="module")
def viewer(files: dict[str, Path]) -> Iterator[str]:
    args = [str(files["rollouts"]), "--tokenizer", str(qwen_tokenizer_dir("qwen3")), "--audit", str(files["audit"]),
            "--figure", str(files["figure"])]  # fmt: skip
    yield from served(args)


@pytest.fixture(scope="module")
def browser(files: dict[str, Path]) -> Iterator[Any]:
    """Chromium, started after the files are made."""
    yield from chromium()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    yield page
    context.close()
    assert not errors, errors  # no script error, no refused resource (the CSP would log one)


def open_page(page: Any, url: str) -> None:
    page.goto(url)
    # predicates as functions: an expression string would be eval'd in the page, which its CSP forbids
    page.wait_for_function("() => document.body.dataset.ready === (location.hash || '#/')")


def photo(page: Any, name: str) -> None:
    """Photograph the page; it must not be blank (one colour): kept in ``TITO_SCREENSHOTS`` when set."""
    from PIL import Image

    shot = page.screenshot(full_page=True)
    colours = Image.open(io.BytesIO(shot)).convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 20, f"{name}: the page looks blank"
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        (Path(SHOTS) / f"viewer-{name}.png").write_bytes(shot)


def test_the_runs_page_lists_filters_and_sorts_the_records_with_its_charts(page: Any, viewer: str) -> None:
    open_page(page, viewer + "/")
    assert page.locator("table.runs tr.run").count() == 4
    assert page.locator("#statuses span").all_inner_texts() == ["completed: 2", "truncated: 1", "failed: 1"]
    assert page.locator(".reward-chart circle.pt").count() == 3  # one dot per rewarded rollout
    assert page.locator(".turn-chart rect.bar").count() == 2  # the longest rollout has 2 turns
    page.wait_for_function("() => document.querySelector('img.figure')?.naturalWidth > 0")
    assert page.locator(".audit").inner_text().startswith("audit: test scorer")
    page.fill(".controls input", "fork")
    assert page.locator("table.runs tr.run").all_inner_texts()[0].startswith("fork")
    page.fill(".controls input", "")
    page.click("th[data-key=reward]")
    page.click("th[data-key=reward]")  # descending; a record without reward last
    tasks = [row.split("\t")[0] for row in page.locator("table.runs tr.run").all_inner_texts()]
    assert tasks[-1] == "broken" and tasks[-2] == "fork"
    photo(page, "runs")


def test_the_record_page_colours_the_loss_mask_and_shows_each_tokens_details(page: Any, viewer: str) -> None:
    open_page(page, viewer + "/#/record/0")
    page.wait_for_selector(".tokens .t.o")
    data = page.evaluate("() => fetch('api/records/0').then(r => r.json())")
    kinds = data["branches"][0]["kinds"]
    for kind in "pob":
        assert page.locator(f".tokens .t.{kind}").count() == kinds.count(kind), kind
    assert page.locator(".turn.forced").count() == 1 and page.locator(".turn.forced .badge").inner_text() == "forced"
    assert page.locator(".turn[data-turn='0'] .head").inner_text().count("1 tool call") == 1
    assert page.locator(".turn[data-turn='1'] .head").inner_text().startswith("turn 1 · prompt: 1 tool result")
    bands = page.locator(".band .version")
    assert [bands.nth(k).get_attribute("data-version") for k in range(bands.count())] == ["1", "2"]
    first_output = page.locator(".turn[data-turn='1'] .t.o").first
    first_output.hover()
    tip = page.locator("#tip")
    tip.wait_for(state="visible")
    text = tip.inner_text()
    index = int(first_output.get_attribute("data-i"))
    assert f"id {data['branches'][0]['ids'][index]}" in text and "output (loss mask 1) · turn 1" in text
    assert "logprob -0.0" in text and "weights 2" in text
    photo(page, "record")
    page.check("#heat")
    page.wait_for_selector(".tokens.heat .t.o[data-heat]")  # redrawn when the chunk is in view
    heated = page.locator(".tokens.heat .t.o[data-heat]")
    assert heated.count() == 12  # the audited tokens, coloured by |Δ| (log scale: 1e-6 .. 1 nats as 0 .. 9)
    levels = [int(heated.nth(k).get_attribute("data-heat")) for k in range(12)]
    assert levels == sorted(levels) and levels[0] == 0 and levels[-1] >= 8
    colours = {heated.nth(k).evaluate("e => getComputedStyle(e).backgroundColor") for k in (0, 11)}
    assert len(colours) == 2  # drawn differently
    photo(page, "heat")


def test_the_picture_is_drawn_at_its_span(page: Any, viewer: str) -> None:
    open_page(page, viewer + "/#/record/1")
    page.wait_for_function("() => document.querySelector('figure.image img')?.naturalWidth > 0")
    figure = page.locator("figure.image")
    data = page.evaluate("() => fetch('api/records/1').then(r => r.json())")
    image = data["branches"][0]["images"][0]
    assert figure.get_attribute("data-start") == str(image["start"])
    assert figure.get_attribute("data-length") == str(IMAGE_PADS)
    assert page.evaluate("() => document.querySelector('figure.image img').naturalWidth") == 56
    before = page.locator(f".t[data-i='{image['start'] - 1}']")
    after = page.locator(f".t[data-i='{image['start'] + IMAGE_PADS}']")
    assert before.count() == after.count() == 1 and page.locator(f".t[data-i='{image['start']}']").count() == 0
    box, prev, nxt = figure.bounding_box(), before.bounding_box(), after.bounding_box()
    assert (prev["y"], prev["x"]) <= (box["y"] + box["height"], box["x"]) and nxt["y"] + nxt["height"] >= box["y"]
    photo(page, "image")


def test_the_branch_tree_reaches_each_branch(page: Any, viewer: str) -> None:
    open_page(page, viewer + "/#/record/2")
    tree = page.locator("#tree")
    assert tree.locator("li.branch").count() == 2
    assert tree.locator("li.branch[data-branch='0'] li.branch[data-branch='1']").count() == 1  # a child of 0
    assert "forked at token" in tree.locator("li.branch[data-branch='1']").inner_text()
    assert "the client rewrote the history" in tree.inner_text()
    assert "once more, louder" in page.locator("#tokens").inner_text()  # the final branch first
    tree.locator("li.branch[data-branch='0'] > a").click()
    page.wait_for_function("() => document.body.dataset.ready === '#/record/2/0'")
    assert "0 of 2" in page.locator("#fields").inner_text()
    page.wait_for_selector(".tokens .t.o")
    assert "once more" not in page.locator("#tokens").inner_text()
    photo(page, "branches")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """`tito serve` on the scripted backend; its address and the viewer address it printed (with its key)."""
    tmp = tmp_path_factory.mktemp("serve")
    tokenizer = str(qwen_tokenizer_dir("qwen3"))
    options = {"tokenizer": tokenizer, "replies": ["The sky is blue."] * 4}
    (tmp / "hook.py").write_text(
        f"def prepare():\n    return {{'tokenizer': {tokenizer!r}, 'backend_options': {options!r}}}\n"
    )
    (tmp / "tito.toml").write_text('backend = "scripted"\n[rollout]\nprepare = "hook:prepare"\n')
    command = [sys.executable, "-m", "tito_core.cli", "serve", "--config", str(tmp / "tito.toml"), "--port", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    assert line.startswith("tito serve: serving on "), (line, proc.stderr.read() if proc.poll() is not None else "")
    viewer = next(line for line in proc.stderr if "viewer at" in line).rsplit(" ", 1)[1].strip()
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining: a full pipe would block it
    yield line.rsplit(" ", 1)[1].strip(), viewer
    proc.terminate()
    assert proc.wait(timeout=60) == 0


def _post(url: str, body: Any, token: str | None = None) -> Any:
    import urllib.request

    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_the_gateways_ui_lists_its_live_rollouts_with_its_key_only(browser: Any, gateway: tuple[str, str]) -> None:
    base, viewer = gateway
    assert viewer.startswith(f"{base}/ui/#key=tito-view-")
    opened = _post(f"{base}/rollouts", {"task_id": "sky"})
    answer = _post(f"{opened['base_url']}/chat/completions", {"model": "m", "messages": [
        {"role": "user", "content": "What colour is the sky?"}]}, opened["token"])  # fmt: skip
    assert answer["choices"][0]["message"]["content"] == "The sky is blue."
    context = browser.new_context(viewport={"width": 1280, "height": 700})
    page = context.new_page()
    try:
        open_page(page, viewer)  # the key moves from the address into the tab's session storage
        assert page.evaluate("() => location.hash") == "#/"
        row = page.locator("table.runs tr.run")
        assert row.count() == 1 and row.inner_text().split("\t")[:3] == ["sky", "0", "running"]
        photo(page, "gateway")
        row.locator("a").click()
        page.wait_for_selector(".tokens .t.o")
        assert "".join(page.locator(".tokens .t.o").all_inner_texts()) == "The sky is blue.<|im_end|>"
    finally:
        context.close()
    stranger = browser.new_context()  # no key: the page loads, its data does not
    page = stranger.new_page()
    try:
        open_page(page, f"{base}/ui/")
        assert "401" in page.locator(".error").inner_text() and "sky" not in page.content()
    finally:
        stranger.close()
