"""The gateway's viewer at /ui: its open and finished rollouts, read-only, under the gateway's rules.

Through real HTTP on the gateway's own server (aiohttp client), scripted backend. What the page draws is
tests/browser's; the viewer's API is tests/viewer's.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from tito_core.gateway import Gateway

USER = [{"role": "user", "content": "hi"}]


async def _get(session: aiohttp.ClientSession, url: str, key: str | None = None, **headers: str) -> tuple[int, Any]:
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    async with session.get(url, headers=headers, allow_redirects=False) as response:
        body = await response.read()
        return response.status, (await response.json() if response.content_type == "application/json" else body)


async def test_the_viewer_shows_open_rollouts_live_and_finished_ones(gateway: Gateway, backend: Any) -> None:
    backend.add("Hello there.")
    rollout = gateway.open(task_id="greet")
    key = gateway.access.viewer_key
    ui = f"{gateway.base_url}/ui"
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{rollout.base_url}/chat/completions", json={"model": "m", "messages": USER},
                                headers={"Authorization": f"Bearer {rollout.token}"}) as response:  # fmt: skip
            assert response.status == 200
        status, runs = await _get(session, f"{ui}/api/runs", key)
        assert status == 200 and runs["live"] is True and runs["statuses"] == {"running": 1}
        (row,) = runs["rows"]
        assert row["index"] == f"open-{rollout.id}" and row["task_id"] == "greet" and row["turns"] == 1
        status, view = await _get(session, f"{ui}/api/records/open-{rollout.id}", key)
        (branch,) = view["branches"]
        assert status == 200 and view["status"] == "running" and view["decoded"] is True
        assert "".join(t for t, k in zip(branch["texts"], branch["kinds"], strict=True) if k == "o") == (
            "Hello there.<|im_end|>"
        )
        async with session.post(f"{rollout.base_url.rsplit('/v1', 1)[0]}/finish", json={"reward": 1.0},
                                headers={"Authorization": f"Bearer {rollout.token}"}) as response:  # fmt: skip
            assert response.status == 200
        status, runs = await _get(session, f"{ui}/api/runs", key)
        (row,) = runs["rows"]
        assert row["index"] == "done-0" and row["status"] == "completed" and row["reward"] == 1.0
        assert (await _get(session, f"{ui}/api/records/done-0", key))[1]["branches"][0]["ids"] == branch["ids"]
        assert (await _get(session, f"{ui}/api/records/open-{rollout.id}", key))[0] == 404  # finished: not open


async def test_an_open_rollout_counts_every_branch_and_the_page_every_version(gateway: Gateway, backend: Any) -> None:
    """A retried call forks the open rollout: its row counts both calls (as a finished record's row does), and the
    page lists every weight version of the open and finished rollouts, so each keeps one colour on every page."""
    backend.add("First try.", "Second try.", "Done.")
    finished, rollout = gateway.open(task_id="old"), gateway.open(task_id="retried")
    key = gateway.access.viewer_key
    ui = f"{gateway.base_url}/ui"
    async with aiohttp.ClientSession() as session:

        async def chat(opened: Any) -> None:
            async with session.post(f"{opened.base_url}/chat/completions", json={"model": "m", "messages": USER},
                                    headers={"Authorization": f"Bearer {opened.token}"}) as response:  # fmt: skip
                assert response.status == 200

        backend.weight_version = "7"
        await chat(finished)
        async with session.post(f"{finished.base_url.rsplit('/v1', 1)[0]}/finish", json={"reward": 0.0},
                                headers={"Authorization": f"Bearer {finished.token}"}) as response:  # fmt: skip
            assert response.status == 200
        backend.weight_version = "10"
        await chat(rollout)
        await chat(rollout)  # the same messages again: a retry, the first output discarded
        status, runs = await _get(session, f"{ui}/api/runs", key)
        assert status == 200
        row = next(r for r in runs["rows"] if r["task_id"] == "retried")
        assert (row["branches"], row["turns"]) == (2, 2)
        assert runs["versions"] == ["7", "10"]  # in version order, not as strings
        status, view = await _get(session, f"{ui}/api/records/open-{rollout.id}", key)
        assert status == 200 and view["version_order"] == ["7", "10"]  # the finished rollout's version too


async def test_the_viewer_takes_its_key_only_and_the_gateways_browser_rules(gateway: Gateway) -> None:
    rollout = gateway.open(task_id="t")
    ui = f"{gateway.base_url}/ui"
    async with aiohttp.ClientSession() as session:
        status, page = await _get(session, f"{ui}/")  # the page itself holds no data
        assert status == 200 and b"static/viewer.js" in page
        assert (await _get(session, ui))[0] == 302  # /ui -> /ui/ (the page's addresses are relative)
        for credential in (None, rollout.token, "wrong"):  # a rollout's token reads its own rollout only
            status, body = await _get(session, f"{ui}/api/runs", credential)
            assert status == 401 and body["error"]["code"] == "invalid_viewer_key"
            assert gateway.access.viewer_key not in str(body)
        key = gateway.access.viewer_key
        status, body = await _get(session, f"{ui}/api/runs", key, Host="evil.example")  # DNS rebinding
        assert status == 403 and body["error"]["code"] == "host_not_allowed"
        status, body = await _get(session, f"{ui}/api/runs", key, Origin="http://evil.example")  # a web page
        assert status == 403 and body["error"]["code"] == "origin_not_allowed"
        async with session.post(f"{ui}/api/runs", json={}, headers={"Authorization": f"Bearer {key}"}) as response:
            assert response.status == 405  # read-only


async def test_with_an_api_key_the_viewer_takes_that_key(backend: Any, qwen3_tokenizer: Any) -> None:
    from .conftest import config

    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, api_key="sekret-key")
    await gateway.start()
    try:
        assert gateway.access.viewer_key == "sekret-key"
        async with aiohttp.ClientSession() as session:
            assert (await _get(session, f"{gateway.base_url}/ui/api/runs", "sekret-key"))[0] == 200
            assert (await _get(session, f"{gateway.base_url}/ui/api/runs", "tito-view-x"))[0] == 401
    finally:
        await gateway.close()
