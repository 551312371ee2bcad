"""`tito view` in a real browser: Debian's headless Chromium driven by Playwright (`nox -s browser`).

The command runs as users run it (a subprocess serving a rollout file on a free loopback port); the checks read
what the page drew: the runs table and its charts, the loss mask's classes, the hover details, the picture at
its span, the branch tree, the version bands and legends and the audit heat map; at a desktop's 1400x900 and a
phone's 390x844: nothing wider than the window (a wide table scrolls inside its box), the token details always
inside the window, sorting and token details by keyboard. Each page is also photographed and the photo must not
be blank (``TITO_SCREENSHOTS=DIR`` keeps them: docs/viewer.md's pictures).
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

from ..helpers.viewer_rollouts import IMAGE_PADS, write_audit, write_rollouts

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (nox -s browser installs it)")
CHROMIUM = os.environ.get("TITO_CHROMIUM", "/usr/bin/chromium")
SHOTS = os.environ.get("TITO_SCREENSHOTS")
DESKTOP, PHONE = {"width": 1400, "height": 900}, {"width": 390, "height": 844}
HEATED = 12  # calc's first output tokens, audited 1e-6 .. ~0.3 nats off: the heat map's whole scale


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

    out_start = next(iter(read_records(rollouts))).trajectory.segments[1].start

    def shift(task: str, i: int) -> float:
        k = i - out_start
        return 10.0 ** (-6 + k / 2) if task == "calc" and 0 <= k < HEATED else 0.0

    report = write_audit(rollouts, tmp / "audit.json", shift)
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


def new_page(browser: Any, viewport: dict[str, int]) -> Iterator[Any]:
    """A page in a fresh context; at its end, no script error and no refused resource (the CSP would log one)."""
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    yield page
    context.close()
    assert not errors, errors


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    yield from new_page(browser, DESKTOP)


@pytest.fixture(params=[DESKTOP, PHONE], ids=["desktop", "phone"])
def any_page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    yield from new_page(browser, request.param)


# elements sticking out of the window, other than inside a box that scrolls sideways
OUTSIDE = """() => {
  const width = document.documentElement.clientWidth;
  const scrolls = (e) => { for (let p = e.parentElement; p; p = p.parentElement) {
    if (["auto", "scroll", "hidden"].includes(getComputedStyle(p).overflowX)) return true; } return false; };
  const out = [...document.querySelectorAll("body *")].filter((e) => {
    const r = e.getBoundingClientRect();
    return r.width > 0 && (r.right > width + 0.5 || r.left < -0.5) && !scrolls(e);
  }).map((e) => `${e.tagName}.${e.className}#${e.id}: ${Math.round(e.getBoundingClientRect().left)}..` +
    `${Math.round(e.getBoundingClientRect().right)}`);
  if (document.documentElement.scrollWidth > width) out.push(`the page: ${document.documentElement.scrollWidth}`);
  return out;
}"""

# the token nearest the window's bottom right corner, brought into view at the bottom of the window
CORNER_TOKEN = """() => {
  const tokens = [...document.querySelectorAll(".tokens .t")];
  const last = tokens[tokens.length - 1];
  last.scrollIntoView({ block: "end" });
  const H = window.innerHeight;
  const seen = tokens.filter((t) => { const r = t.getBoundingClientRect(); return r.bottom <= H && r.top >= 0; });
  seen.sort((a, b) => b.getBoundingClientRect().bottom - a.getBoundingClientRect().bottom ||
    b.getBoundingClientRect().right - a.getBoundingClientRect().right);
  return Number(seen[0].dataset.i);
}"""


def fits(page: Any) -> None:
    """Nothing sticks out of the window sideways (wide tables scroll inside their boxes)."""
    assert page.evaluate(OUTSIDE) == [], page.viewport_size


def tip_inside(page: Any) -> str:
    """The token details are shown, wholly inside the window; their text."""
    tip = page.locator("#tip")
    tip.wait_for(state="visible")
    box = tip.bounding_box()
    size = page.evaluate("() => [document.documentElement.clientWidth, window.innerHeight]")
    assert box["x"] >= 0 and box["y"] >= 0, box
    assert box["x"] + box["width"] <= size[0] and box["y"] + box["height"] <= size[1], (box, size)
    return tip.inner_text()


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
    turns = {row.split("\t")[0]: row.split("\t")[7] for row in page.locator("table.runs tr.run").all_inner_texts()}
    assert turns == {"calc": "2", "look": "2", "fork": "3", "broken": "0"}  # every branch's calls, each once
    photo(page, "runs")


def test_the_worst_rollouts_are_one_key_press_away(any_page: Any, viewer: str) -> None:
    """The audit's per-rollout columns sort by keyboard: Tab reaches a header, Enter sorts (again: reverses)."""
    page = any_page
    open_page(page, viewer + "/")
    heads = page.locator("table.runs th").all_inner_texts()
    assert heads[-2:] == ["max |Δ|", "free k3"]
    for _ in range(60):  # Tab through the page to the column's header, as a keyboard user does
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.closest('th')?.dataset.key") == "audit_max_abs":
            break
    else:
        raise AssertionError("Tab never reached the max |Δ| header")
    page.keyboard.press("Enter")
    page.keyboard.press("Enter")
    header = page.locator("th[data-key=audit_max_abs]")
    assert header.get_attribute("aria-sort") == "descending"
    assert page.evaluate("() => document.activeElement.closest('th')?.dataset.key") == "audit_max_abs"  # kept
    rows = [row.split("\t") for row in page.locator("table.runs tr.run").all_inner_texts()]
    assert [r[0] for r in rows] == ["calc", "look", "fork", "broken"]  # the worst first; nothing scored last
    assert rows[0][-2] == "3.16e-1" and rows[-1][-2] == "–"
    fits(page)
    if page.viewport_size == PHONE:
        assert page.evaluate(
            "() => document.getElementById('runs').parentElement.scrollWidth > innerWidth"
        )  # scrolls inside
        photo(page, "phone-runs")


def test_one_colour_per_weight_version_on_every_page(page: Any, viewer: str) -> None:
    open_page(page, viewer + "/")
    legend = page.locator("#version-legend .version")
    assert [legend.nth(k).get_attribute("data-version") for k in range(legend.count())] == ["1", "2"]
    swatch = "e => getComputedStyle(e).backgroundColor"
    colours = {v: page.locator(f"#version-legend [data-version='{v}'] .swatch").evaluate(swatch) for v in "12"}
    assert colours["1"] != colours["2"]
    for record, versions in (("0", "12"), ("2", "2")):  # fork:0 has weights 2 only: still version 2's colour
        open_page(page, f"{viewer}/#/record/{record}")
        page.wait_for_selector(".tokens .t")
        bands = page.locator(".band .version")
        assert {bands.nth(k).evaluate(swatch) for k in range(bands.count())} == {colours[v] for v in versions}
        own = page.locator("#record-versions .version")
        assert [own.nth(k).get_attribute("data-version") for k in range(own.count())] == list(versions)
        assert {v: page.locator(f"#record-versions [data-version='{v}'] .swatch").evaluate(swatch)
                for v in versions} == {v: colours[v] for v in versions}  # fmt: skip


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
    scored = [d for d, k in zip(data["branches"][0]["deltas"], kinds, strict=True) if k == "o" and d is not None]
    assert heated.count() == len(scored) > HEATED  # every audited token, coloured by |Δ| (log scale: 1e-6 .. 1 nat)
    levels = [int(heated.nth(k).get_attribute("data-heat")) for k in range(HEATED)]
    assert levels == sorted(levels) and levels[0] == 0 and levels[-1] >= 8
    colours = {heated.nth(k).evaluate("e => getComputedStyle(e).backgroundColor") for k in (0, HEATED - 1)}
    assert len(colours) == 2  # drawn differently
    scale = page.locator("#heat-scale [data-heat]")
    assert scale.count() == 10  # the legend: the same colours, level by level
    assert scale.nth(HEATED - 1 if levels[-1] == 9 else levels[-1]).evaluate(
        "e => getComputedStyle(e).backgroundColor") in colours  # fmt: skip
    photo(page, "heat")


def test_a_newline_token_is_drawn_and_marked(page: Any, viewer: str) -> None:
    open_page(page, viewer + "/#/record/0")
    page.wait_for_selector(".tokens .t.b")
    data = page.evaluate("() => fetch('api/records/0').then(r => r.json())")
    branch = data["branches"][0]
    newline = next(i for i, (t, k) in enumerate(zip(branch["texts"], branch["kinds"], strict=True))
                   if t == "\n" and k == "b")  # fmt: skip
    token = page.locator(f".t[data-i='{newline}']")
    assert token.inner_text().startswith("↵") and token.bounding_box()["width"] > 4  # visible, in its colour
    assert token.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(253, 233, 200)"  # --boundary


def test_the_token_details_stay_inside_the_window(any_page: Any, viewer: str) -> None:
    """Next to the token, flipped above or to its left where the window ends: hovered, or tapped on a phone."""
    page = any_page
    open_page(page, viewer + "/#/record/0")
    page.wait_for_selector(".tokens .t.o")
    fits(page)
    corner = page.evaluate(CORNER_TOKEN)
    token = page.locator(f".t[data-i='{corner}']")
    if page.viewport_size == PHONE:
        token.click()  # a tap: the details stay (pinned) until Esc or a tap elsewhere
        assert "pinned" in tip_inside(page)
        photo(page, "phone-record")
    else:
        token.hover()
        assert f"token {corner} " in tip_inside(page)
    first = page.evaluate(
        "() => { const t = document.querySelector('.tokens .t'); t.scrollIntoView(); return Number(t.dataset.i); }"
    )
    page.mouse.click(1, 1)  # elsewhere: the details close
    page.locator(f".t[data-i='{first}']").hover()
    assert f"token {first} " in tip_inside(page)


def test_the_tokens_are_read_by_keyboard(any_page: Any, viewer: str) -> None:
    page = any_page
    open_page(page, viewer + "/#/record/0")
    page.wait_for_selector(".tokens .t")
    for _ in range(60):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.id") == "tokens":
            break
    else:
        raise AssertionError("Tab never reached the tokens")
    assert page.locator(".t.sel").get_attribute("data-i") == "0"
    assert tip_inside(page).startswith("token 0 · id ")
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowLeft")
    assert page.locator(".t.sel").get_attribute("data-i") == "2"
    assert tip_inside(page).startswith("token 2 · id ")
    page.keyboard.press("Enter")  # pin: the details stay while the mouse goes elsewhere
    assert "pinned" in tip_inside(page)
    page.locator(".t[data-i='5']").hover()
    assert tip_inside(page).startswith("token 2 · id ")
    page.keyboard.press("End")
    last = int(page.locator(".t.sel").get_attribute("data-i"))
    assert last == len(page.evaluate("() => fetch('api/records/0').then(r => r.json())")["branches"][0]["ids"]) - 1
    assert tip_inside(page).startswith(f"token {last} · id ")  # brought into view, details beside it
    page.keyboard.press("Escape")
    page.locator("#tip").wait_for(state="hidden")


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
    data = page.evaluate("() => fetch('api/records/2').then(r => r.json())")
    shared = data["branches"][1]["shared"]
    assert f"shares {shared} tokens with branch 0 (forked at token {data['branches'][1]['fork_at']})" in tree.locator(
        "li.branch[data-branch='1']").inner_text()  # fmt: skip
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
    viewer = proc.stdout.readline()  # on the same stream, right after
    assert viewer.startswith("tito serve: viewer at "), viewer
    viewer = viewer.rsplit(" ", 1)[1].strip()
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining: a full pipe would block it
    threading.Thread(target=proc.stdout.read, daemon=True).start()
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
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    try:
        open_page(page, viewer)  # the key moves from the address into the tab's session storage
        assert page.evaluate("() => location.hash") == "#/"
        row = page.locator("table.runs tr.run")
        assert row.count() == 1 and row.inner_text().split("\t")[:3] == ["sky", "0", "running"]
        photo(page, "gateway")
        _post(f"{base}/rollouts", {"task_id": "sea"})  # the page shows it by itself (it refreshes every 2 s)
        page.wait_for_function("() => document.querySelectorAll('table.runs tr.run').length === 2", timeout=60_000)
        assert "live: refreshed every 2 s" in page.locator("#live").inner_text()
        row = page.locator("table.runs tr.run", has_text="sky")
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
