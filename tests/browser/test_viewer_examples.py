"""`tito view` on the outputs of two examples, in Debian's headless Chromium (`nox -s browser`).

``examples/arithmetic`` (``tito rollout`` with its config, on the tiny random Qwen3 instead of SmolLM2: a forced
first call, then free calls) and ``examples/look_agent`` (a Strands agent on the tiny Qwen2.5-VL whose tool
returns a picture, written as a record with its picture in ``<output>.images/``). The pages must show the loss
mask, the hover details, the picture at its span and the branch tree of what the examples really recorded.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tito_testing.tokenizers import qwen_tokenizer_dir

from .test_viewer_pages import chromium, open_page, photo, served

pytest.importorskip("torch", reason="the examples run on the embedded backend (nox -s browser installs torch)")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run both examples (made before Chromium starts: Playwright's sync API holds an event loop)."""
    from tito_core import rollout
    from tito_core.records import open_writer, rollout_record
    from tito_testing.tiny_model import build_tiny_qwen3
    from tito_testing.tiny_vl import build_tiny_qwen25_vl

    tmp = tmp_path_factory.mktemp("examples")
    example = ROOT / "examples" / "arithmetic"
    tasks = tmp / "tasks.jsonl"
    tasks.write_text("".join((example / "tasks.jsonl").read_text().splitlines(True)[:2]))
    arithmetic = tmp / "arithmetic.jsonl"
    summary = rollout(example / "tito.toml", tasks, arithmetic, prepare="", tokenizer=str(qwen_tokenizer_dir("qwen3")),
                      backend_options={"model_path": str(build_tiny_qwen3()), "num_threads": 1},
                      sampling={"temperature": 1.0, "max_new_tokens": 24, "seed": 0}, group_size=2,
                      max_model_calls=2)  # fmt: skip
    assert summary.written == 4

    spec = importlib.util.spec_from_file_location("look_agent", ROOT / "examples" / "look_agent" / "look_agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    vl = build_tiny_qwen25_vl()
    task, traj, ended = asyncio.run(module.run(0, model_dir=vl))
    assert traj.media, f"the look tool did not run: {ended}"
    look = tmp / "look.jsonl"
    with open_writer(look) as writer:
        writer.write(rollout_record(traj.close(), task_id="look", sample=0, group=0, reward=None, server=None,
                                    started=0.0, wall_s=1.0, agent_s=1.0, tool_calls=1))  # fmt: skip
    return {"arithmetic": arithmetic, "look": look, "look_tokenizer": vl}


@pytest.fixture(scope="module")
def browser(outputs: dict[str, Path]) -> Iterator[Any]:
    """Chromium, started after the examples ran."""
    yield from chromium()


@pytest.fixture(scope="module")
def arithmetic(outputs: dict[str, Path]) -> Iterator[str]:
    yield from served([str(outputs["arithmetic"]), "--tokenizer", str(qwen_tokenizer_dir("qwen3"))])


@pytest.fixture(scope="module")
def look(outputs: dict[str, Path]) -> Iterator[str]:
    yield from served([str(outputs["look"]), "--tokenizer", str(outputs["look_tokenizer"])])


def check_mask_and_hover(page: Any, data: dict[str, Any]) -> None:
    """Every token drawn with its kind's class; hovering an output token names it."""
    branch = data["branches"][-1]
    page.wait_for_selector(".tokens .t.o")
    pictured = sum(image["length"] for image in branch["images"])  # placeholders: drawn as the picture itself
    for kind in "pob":
        expected = branch["kinds"].count(kind) - (pictured if kind == "p" else 0)
        assert page.locator(f".tokens .t.{kind}").count() == expected, kind
    token = page.locator(".tokens .t.o").first
    token.hover()
    page.locator("#tip").wait_for(state="visible")
    index = int(token.get_attribute("data-i"))
    assert f"token {index} · id {branch['ids'][index]}" in page.locator("#tip").inner_text()
    assert "output (loss mask 1)" in page.locator("#tip").inner_text()
    tree = page.locator("#tree li.branch")
    assert tree.count() == len(data["branches"])


def test_the_arithmetic_examples_output(browser: Any, arithmetic: str) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        open_page(page, arithmetic + "/")
        assert page.locator("table.runs tr.run").count() == 4
        open_page(page, arithmetic + "/#/record/0")
        data = page.evaluate("() => fetch('api/records/0').then(r => r.json())")
        check_mask_and_hover(page, data)
        assert page.locator(".turn.forced .badge").count() == 1  # forced_tool_calls = 1: the first call
        photo(page, "arithmetic")
    finally:
        page.close()


def test_the_look_agents_picture_is_at_its_span(browser: Any, look: str) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        open_page(page, look + "/#/record/0")
        data = page.evaluate("() => fetch('api/records/0').then(r => r.json())")
        check_mask_and_hover(page, data)
        (image,) = data["branches"][-1]["images"]
        page.wait_for_function("() => document.querySelector('figure.image img')?.naturalWidth > 0")
        figure = page.locator("figure.image")
        assert figure.get_attribute("data-start") == str(image["start"])
        assert page.evaluate("() => document.querySelector('figure.image img').naturalWidth") == image["size"][0]
        assert page.locator(f".t[data-i='{image['start'] - 1}']").count() == 1  # the text right before it
        photo(page, "look-agent")
    finally:
        page.close()
