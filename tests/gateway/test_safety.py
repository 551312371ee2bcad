"""The gateway's safety: 404, 409 (finished), api key and loopback, bounded bodies, idle timeout, and
`tito serve` in a subprocess (its config's prepare hook, SIGTERM)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.gateway.conftest import config
from tito_core.errors import ConfigError
from tito_core.gateway import Gateway
from tito_core.records import read_records
from tito_testing.tokenizers import qwen_tokenizer_dir

USER = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def post(url: str, body: Any, **headers: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body, headers=headers) as response:
        return response.status, await response.json()


async def test_unknown_rollout_is_404_and_finished_one_409(gateway: Gateway, backend: Any) -> None:
    status, body = await post(f"{gateway.base_url}/rollouts/nope/v1/chat/completions", USER)
    assert status == 404 and body["error"]["code"] == "rollout_not_found"
    status, opened = await post(f"{gateway.base_url}/rollouts", {"task_id": "t"})
    assert status == 201 and opened["base_url"] == f"{gateway.base_url}/rollouts/{opened['id']}/v1"
    auth = {"Authorization": f"Bearer {opened['token']}"}
    status, record = await post(f"{gateway.base_url}/rollouts/{opened['id']}/finish", {"reward": 0.5}, **auth)
    assert status == 200 and record["reward"] == 0.5 and record["status"] == "failed"  # never called: no output
    assert record["status_reason"] == "the rollout ended without any model call: it holds no output"
    status, body = await post(f"{opened['base_url']}/chat/completions", USER, **auth)
    assert status == 409 and body["error"]["code"] == "rollout_finished"
    assert backend.requests == []


async def test_api_key_is_required_and_checked(backend: Any, qwen3_tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match="requires an api key"):
        await Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend).start("0.0.0.0")
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, api_key="sekrit")
    await gateway.start()
    try:
        backend.add("ok")
        status, body = await post(f"{gateway.base_url}/rollouts", {})
        assert status == 401 and body["error"]["type"] == "authentication_error"
        status, opened = await post(f"{gateway.base_url}/rollouts", {}, Authorization="Bearer sekrit")
        assert status == 201
        url = f"{gateway.base_url}/v1/chat/completions"
        status, _ = await post(url, USER, Authorization=f"Bearer wrong:{opened['id']}")
        assert status == 401
        status, answer = await post(url, USER, Authorization=f"Bearer {opened['token']}")
        assert status == 200 and answer["choices"][0]["message"]["content"] == "ok"
    finally:
        await gateway.close()


async def test_body_over_the_limit_is_413(backend: Any, qwen3_tokenizer: Any) -> None:
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, max_body_bytes=4096)
    await gateway.start()
    try:
        rollout = gateway.open()
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 10_000}]}
        status, body = await post(f"{rollout.base_url}/chat/completions", big, Authorization=f"Bearer {rollout.token}")
        assert status == 413 and body["error"]["code"] == "body_too_large"
        assert backend.requests == []
    finally:
        await gateway.close()


async def test_idle_rollout_ends_with_a_status_and_is_written(
    backend: Any, qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    out = tmp_path / "idle.jsonl"
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, output=out, idle_timeout=0.2)
    ended = asyncio.Event()
    on_idle = gateway.registry._on_idle

    async def noted(rollout: Any) -> None:
        await on_idle(rollout)
        ended.set()

    gateway.registry._on_idle = noted
    called = False  # the sweep looks only after the first call: a slow machine cannot idle the rollout before it
    find_idle = gateway.registry.idle
    gateway.registry.idle = lambda now=None: find_idle(now) if called else []  # type: ignore[method-assign]
    await gateway.start()
    try:
        backend.add("<tool_call>\n" + json.dumps({"name": "f", "arguments": {}}) + "\n</tool_call>")
        rollout = gateway.open(task_id="idle")
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        auth = {"Authorization": f"Bearer {rollout.token}"}
        status, _ = await post(f"{rollout.base_url}/chat/completions", {**USER, "tools": tools}, **auth)
        assert status == 200
        called = True
        await asyncio.wait_for(ended.wait(), 30)  # hang guard only
        status, body = await post(f"{rollout.base_url}/chat/completions", USER, **auth)
        assert status == 409
    finally:
        await gateway.close()
    (record,) = read_records(out)
    assert record.status == "aborted" and "idle timeout" in (record.status_reason or "")
    assert record.trajectory.metadata["gateway_end"] == "idle_timeout"
    assert record.tokens.model_calls == 1


async def test_serve_runs_the_prepare_hook_and_sigterm_writes_open_rollouts_as_aborted(tmp_path: Path) -> None:
    # The config sets its tokenizer and backend options only through `rollout.prepare`, as the embedded
    # example does (examples/arithmetic): `tito serve` runs the hook first, as `tito rollout` does.
    tokenizer = qwen_tokenizer_dir("qwen3")
    (tmp_path / "hook.py").write_text(
        "def prepare():\n"
        f"    return {{'tokenizer': {str(tokenizer)!r},\n"
        f"            'backend_options': {{'tokenizer': {str(tokenizer)!r}, 'replies': ['first answer']}}}}\n"
    )
    cfg = tmp_path / "tito.toml"
    cfg.write_text('backend = "scripted"\n[rollout]\nprepare = "hook:prepare"\n')
    out = tmp_path / "served.jsonl"
    code = "import sys; from tito_core.cli import main; sys.exit(main())"
    args = ["serve", "--config", str(cfg), "--port", "0", "--output", str(out)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()  # hang guard only
        assert line.startswith("tito serve: serving on "), line
        base = line.rsplit(" ", 1)[1].strip()
        _, opened = await post(f"{base}/rollouts", {"task_id": "live"})
        status, answer = await post(
            f"{opened['base_url']}/chat/completions", USER, Authorization=f"Bearer {opened['token']}"
        )
        assert status == 200 and answer["choices"][0]["message"]["content"] == "first answer"
        _, idle = await post(f"{base}/rollouts", {"task_id": "never-called"})
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 120) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    records = {r.task_id: r for r in read_records(out)}
    assert set(records) == {"live", "never-called"}
    assert all(r.status == "aborted" for r in records.values())
    assert "shut down" in (records["live"].status_reason or "")
    assert records["live"].tokens.model_calls == 1 and records["never-called"].tokens.total == 0
