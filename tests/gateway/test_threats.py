"""The gateway against its threat model (docs/gateway.md, "Threat model"): a web page in the user's browser on the
same machine, sibling agents sharing the gateway, and credentials that must never leak.

A page's requests are sent here as a browser sends them (the headers of a cross-origin "simple" request and of
a DNS-rebound one); each is refused before anything is opened, called, read or finished.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.gateway.conftest import config
from tito_core.errors import ConfigError
from tito_core.gateway import Gateway
from tito_core.gateway.errors import MAX_JSON_DEPTH
from tito_core.gateway.server import api_key_from
from tito_core.records import read_records

USER = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
EVIL = "http://evil.example"


async def send(method: str, url: str, body: bytes | None = None, **headers: str) -> tuple[int, dict[str, str], str]:
    async with aiohttp.ClientSession() as session, session.request(method, url, data=body, headers=headers) as r:
        return r.status, dict(r.headers), await r.text()


def json_body(data: Any) -> bytes:
    return json.dumps(data).encode()


async def _opened(gateway: Gateway, backend: Any, **fields: Any) -> dict[str, Any]:
    status, _, text = await send(
        "POST", f"{gateway.base_url}/rollouts", json_body(fields), **{"Content-Type": "application/json"}
    )
    assert status == 201, text
    opened: dict[str, Any] = json.loads(text)
    return opened


async def test_a_cross_origin_page_can_open_call_read_or_finish_nothing(gateway: Gateway, backend: Any) -> None:
    backend.add("never")
    victim = await _opened(gateway, backend, task_id="victim")
    base, rid = gateway.base_url, victim["id"]
    # what `fetch(url, {method: "POST", body: "..."})` from another origin sends: text/plain, its Origin
    page = {"Origin": EVIL, "Content-Type": "text/plain;charset=UTF-8", "Sec-Fetch-Site": "cross-site"}
    attempts = [
        ("POST", f"{base}/rollouts", json_body({"task_id": "planted"})),
        ("POST", f"{base}/rollouts/{rid}/v1/chat/completions", json_body(USER)),
        ("POST", f"{base}/rollouts/{rid}/finish", json_body({"reward": 1.0})),
        ("GET", f"{base}/rollouts/{rid}", None),
    ]
    for method, url, body in attempts:
        status, headers, text = await send(method, url, body, **page)
        assert status == 403 and "origin_not_allowed" in text, (url, status, text)
        assert not any(h.lower().startswith("access-control-") for h in headers)  # no CORS header, ever
        # the same page with the rollout's token (it has none; even so) and a JSON type: still refused
        status, _, _ = await send(method, url, body, Origin=EVIL, Authorization=f"Bearer {victim['token']}",
                                  **{"Content-Type": "application/json"})  # fmt: skip
        assert status == 403
    # a "simple" POST without an Origin (a non-browser client that copied a browser's type): not JSON, refused
    status, _, text = await send("POST", f"{base}/rollouts", json_body({}), **{"Content-Type": "text/plain"})
    assert status == 415 and "not_json" in text
    status, headers, _ = await send("OPTIONS", f"{base}/rollouts", None, Origin=EVIL)  # a CORS preflight
    assert status >= 400 and not any(h.lower().startswith("access-control-") for h in headers)
    assert len(gateway.registry) == 1 and backend.requests == []  # nothing opened, nothing generated
    await gateway.close()
    (record,) = read_records(gateway.output_path)
    assert record.task_id == "victim" and record.reward is None  # no planted record, no reward set by the page


async def test_a_dns_rebound_page_is_refused_by_its_host(gateway: Gateway, backend: Any) -> None:
    victim = await _opened(gateway, backend, task_id="victim")
    port = gateway.base_url.rsplit(":", 1)[1]
    # after rebinding, the page's requests reach 127.0.0.1 with its own name as Host (same-origin: no Origin)
    rebound = {"Host": f"evil.example:{port}", "Authorization": f"Bearer {victim['token']}"}
    status, _, text = await send("GET", f"{gateway.base_url}/rollouts/{victim['id']}", None, **rebound)
    assert status == 403 and "host_not_allowed" in text
    for host in (f"localhost:{port}", f"127.0.0.1:{port}"):  # the loopback names a client may use are served
        status, _, _ = await send("GET", f"{gateway.base_url}/rollouts/{victim['id']}", None, Host=host,
                                  Authorization=f"Bearer {victim['token']}")  # fmt: skip
        assert status == 200


async def test_allowed_hosts_and_origins_are_served(backend: Any, qwen3_tokenizer: Any) -> None:
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, allow_hosts=["tito.internal"],
                      allow_origins=["https://ui.example"])  # fmt: skip
    await gateway.start()
    try:
        port = gateway.base_url.rsplit(":", 1)[1]
        json_type = {"Content-Type": "application/json"}
        for headers in ({"Host": "tito.internal"}, {"Host": f"tito.internal:{port}"}, {"Origin": "https://ui.example"}):
            status, _, text = await send("POST", f"{gateway.base_url}/rollouts", b"{}", **json_type, **headers)
            assert status == 201, (headers, text)
        status, _, _ = await send("POST", f"{gateway.base_url}/rollouts", b"{}", **json_type, Origin=EVIL)
        assert status == 403
    finally:
        await gateway.close()


async def test_one_rollouts_token_cannot_touch_another(gateway: Gateway, backend: Any) -> None:
    mine = await _opened(gateway, backend, task_id="t", id="t:0")  # the runner's ids are guessable: task:sample
    sibling = await _opened(gateway, backend, task_id="t", id="t:1")
    assert mine["token"] != sibling["token"] and len(mine["token"]) >= len("tito-") + 22  # >= 128 random bits
    json_type = {"Content-Type": "application/json"}
    with_mine = {"Authorization": f"Bearer {mine['token']}", **json_type}
    base = f"{gateway.base_url}/rollouts/{sibling['id']}"
    for method, url, body in [
        ("POST", f"{base}/v1/chat/completions", json_body(USER)),
        ("GET", base, None),
        ("POST", f"{base}/finish", json_body({"reward": 1.0})),
        ("GET", f"{base}/v1/models", None),
    ]:
        status, _, text = await send(method, url, body, **with_mine)
        assert status == 401 and "invalid_rollout_token" in text, (url, status)
        status, _, _ = await send(method, url, body, **json_type)  # no credential at all
        assert status == 401
    # the id alone (what the runner used to pass as the api key) is no credential either
    status, _, _ = await send("POST", f"{gateway.base_url}/v1/chat/completions", json_body(USER),
                              Authorization=f"Bearer {sibling['id']}", **json_type)  # fmt: skip
    assert status == 401
    # and a client cannot choose a token
    status, _, text = await send("POST", f"{gateway.base_url}/rollouts", json_body({"token": "chosen"}), **json_type)
    assert status == 400 and "token" in text
    backend.add("mine")
    status, _, _ = await send("POST", f"{gateway.base_url}/v1/chat/completions", json_body(USER), **with_mine)
    assert status == 200 and len(backend.requests) == 1  # the token names its own rollout, and only it
    assert not gateway.get(sibling["id"]).core.trajectory.turns


async def test_no_credential_is_ever_echoed(gateway: Gateway, backend: Any, caplog: pytest.LogCaptureFixture) -> None:
    secret = "sk-live-0123456789abcdefSECRET"
    json_type = {"Content-Type": "application/json"}
    urls = [f"{gateway.base_url}/v1/chat/completions", f"{gateway.base_url}/rollouts/nope/v1/chat/completions",
            f"{gateway.base_url}/v1/models"]  # fmt: skip
    for url in urls:
        for header in ({"Authorization": f"Bearer {secret}"}, {"x-api-key": secret}):
            status, headers, text = await send("POST" if "chat" in url else "GET", url, json_body(USER),
                                               **header, **json_type)  # fmt: skip
            assert status in (200, 401, 404) and secret not in text and secret not in str(headers), (url, text)
    assert secret not in caplog.text


@pytest.mark.parametrize("key", ["plain", "with:colons:in:it", "sp aces +/=~!@#$%^&*()[]{}<>?,.;'\\\"`|"])
async def test_any_characters_work_in_a_key(backend: Any, qwen3_tokenizer: Any, key: str) -> None:
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, api_key=key)
    await gateway.start()
    try:
        json_type = {"Content-Type": "application/json"}
        status, _, _ = await send("POST", f"{gateway.base_url}/rollouts", b"{}", **json_type)
        assert status == 401  # opening takes the key
        async with aiohttp.ClientSession() as session:
            auth = {"Authorization": f"Bearer {key}", **json_type}  # any printable ASCII: what a header carries
            async with session.post(f"{gateway.base_url}/rollouts", data=b"{}", headers=auth) as response:
                opened = await response.json()
                assert response.status == 201, opened
        backend.add("ok")
        status, _, text = await send("POST", f"{gateway.base_url}/v1/chat/completions", json_body(USER),
                                     Authorization=f"Bearer {opened['token']}", **json_type)  # fmt: skip
        assert status == 200, text
    finally:
        await gateway.close()


@pytest.mark.parametrize(("rid", "ok"), [("a" * 256, True), ("a" * 257, False), ("a/b", False), ("t:0@x_y-z.1", True)])
async def test_ids_are_at_most_256_documented_characters(gateway: Gateway, rid: str, ok: bool) -> None:
    status, _, text = await send("POST", f"{gateway.base_url}/rollouts", json_body({"id": rid}),
                                 **{"Content-Type": "application/json"})  # fmt: skip
    assert status == (201 if ok else 400), text
    assert len(gateway.registry) == (1 if ok else 0)


def test_the_key_comes_from_a_file_or_the_environment_not_only_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def _api_key(args: dict[str, Any]) -> str | None:
        return api_key_from(args.get("api_key"), args.get("api_key_file"))

    def args(**values: Any) -> dict[str, Any]:
        return values

    (tmp_path / "key").write_text("from:the file\n")
    assert _api_key(args(api_key_file=str(tmp_path / "key"))) == "from:the file"
    monkeypatch.setenv("TITO_API_KEY", "from the environment")
    assert _api_key(args()) == "from the environment"
    assert _api_key(args(api_key="given")) == "given"
    with pytest.raises(ConfigError, match="give the api key once"):
        _api_key(args(api_key="a", api_key_file=str(tmp_path / "key")))
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError, match="first line is empty"):
        _api_key(args(api_key_file=str(tmp_path / "empty")))
    with pytest.raises(ConfigError, match="cannot read it"):
        _api_key(args(api_key_file=str(tmp_path / "missing")))


def _nested(depth: int) -> bytes:
    """A JSON body whose arrays and objects nest ``depth`` deep: ``{"metadata": {"deep": [[...]]}}``."""
    return b'{"metadata": {"deep": ' + b"[" * (depth - 2) + b"]" * (depth - 2) + b"}}"


@pytest.mark.parametrize("depth", [1000, MAX_JSON_DEPTH + 1])
async def test_json_nested_too_deep_is_a_400_in_each_fronts_shape_on_every_post_route(
    gateway: Gateway, backend: Any, depth: int
) -> None:
    """1,000 deep was an uncaught RecursionError in msgspec: aiohttp's plain-text 500 on every POST route. Just
    over the bound decodes, and was taken (a record nested ~1,000 deep failed to be written at finish)."""
    opened = await _opened(gateway, backend)
    base, rid = gateway.base_url, opened["id"]
    routes = ["/rollouts", f"/rollouts/{rid}/reward", f"/rollouts/{rid}/finish"]
    for prefix in (f"/rollouts/{rid}", ""):  # the rollout by its path, or by its token alone
        routes += [
            f"{prefix}/v1/{api}" for api in ("chat/completions", "responses", "messages", "messages/count_tokens")
        ]
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {opened['token']}"}
    for route in routes:
        status, _, text = await send("POST", base + route, _nested(depth), **headers)
        assert status == 400, (route, text)
        body = json.loads(text)
        if "/v1/messages" in route:  # Anthropic's error object
            assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", (route, body)
        else:  # OpenAI's
            assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == "body", (route, body)
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in body["error"]["message"], (route, body)
    assert backend.requests == [] and len(gateway.registry) == 1  # nothing opened, called or finished


async def test_json_as_deep_as_the_bound_is_taken_and_written(gateway: Gateway, backend: Any, tmp_path: Path) -> None:
    headers = {"Content-Type": "application/json"}
    status, _, text = await send("POST", f"{gateway.base_url}/rollouts", _nested(MAX_JSON_DEPTH), **headers)
    assert status == 201, text
    opened = json.loads(text)
    headers["Authorization"] = f"Bearer {opened['token']}"
    finish = f"{gateway.base_url}/rollouts/{opened['id']}/finish"
    status, _, text = await send("POST", finish, _nested(MAX_JSON_DEPTH), **headers)
    assert status == 200, text
    (record,) = read_records(tmp_path / "out.jsonl")  # written in the handler, its stack below the decoder's
    deep, depth = record.trajectory.metadata["deep"], 0
    while deep is not None:
        deep, depth = (deep[0] if deep else None), depth + 1
    assert depth == MAX_JSON_DEPTH - 2


async def test_tool_call_arguments_nested_too_deep_are_a_400_naming_them(gateway: Gateway, backend: Any) -> None:
    """Arguments are a JSON string in the body: json.loads raised RecursionError (a 500) at 1,000 deep."""
    opened = await _opened(gateway, backend)
    for depth in (1000, MAX_JSON_DEPTH + 1):
        arguments = "[" * depth + "]" * depth
        call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c", "content": "done"},
        ]
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {opened['token']}"}
        url = f"{opened['base_url']}/chat/completions"
        status, _, text = await send("POST", url, json_body({"messages": messages}), **headers)
        assert status == 400, text
        error = json.loads(text)["error"]
        assert error["param"] == "messages[1].tool_calls[0].function.arguments", error
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in error["message"]
    assert backend.requests == []


@pytest.mark.parametrize(
    ("flag", "env", "source"),
    [(["--api-key", ""], None, "--api-key"), (["--api-key", " \t"], None, "--api-key"),
     ([], "", "TITO_API_KEY"), ([], "  ", "TITO_API_KEY")],
)  # fmt: skip
def test_an_empty_api_key_is_an_error_not_no_key(tmp_path: Path, flag: list[str], env: str | None, source: str) -> None:
    """`tito serve --api-key ""` (or `TITO_API_KEY=` set empty) served with no key at all; it exits 2 with one line
    naming where the empty key came from, before any work."""
    import os
    import subprocess
    import sys

    from tito_testing.tokenizers import qwen_tokenizer_dir

    tok = json.dumps(str(qwen_tokenizer_dir("qwen3")))
    cfg = tmp_path / "tito.toml"
    cfg.write_text(f'backend = "scripted"\ntokenizer = {tok}\n[backend_options]\ntokenizer = {tok}\n')
    environ = {k: v for k, v in os.environ.items() if k != "TITO_API_KEY"}
    if env is not None:
        environ["TITO_API_KEY"] = env
    code = "import sys; from tito_core.cli import main; sys.exit(main())"
    args = [sys.executable, "-c", code, "serve", "--config", str(cfg), "--port", "0", *flag]
    # a hang guard only: before the fix the gateway served (with no key) until killed
    done = subprocess.run(args, env=environ, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"tito serve: error: {source} is empty"), done.stderr


@pytest.mark.parametrize("key", ["", "   "])
async def test_the_python_api_refuses_an_empty_key(backend: Any, qwen3_tokenizer: Any, key: str) -> None:
    with pytest.raises(ConfigError, match="api_key must be a string that is not empty or only whitespace"):
        Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, api_key=key)
