"""A third party's front: registered through the plugin manager (``tito_fronts``), served by the gateway's app under
every rollout and by token, with its own errors, and recorded as any front's calls are."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.gateway.conftest import config
from tito_core.gateway import Gateway
from tito_core.gateway.call import CallAnswer, CallRequest
from tito_core.gateway.errors import GatewayError, bad_request
from tito_core.gateway.fronts import Context, Decoded, Front, Route
from tito_core.gateway.sse import Event
from tito_core.plugins import FrontSpec, hookimpl, temporary_plugin


class Echo(Front):
    """A toy wire API: ``{"say": TEXT}`` in, ``{"heard": TEXT}`` out."""

    name = "echo"
    routes = (Route("/v1/echo"),)
    key_headers = ("x-echo-key",)

    def decode(self, body: Any, context: Context) -> Decoded:
        if not isinstance(body, dict) or not isinstance(body.get("say"), str):
            raise bad_request("say", "must be a string")
        history = context.history("say")
        history.user(body["say"], "say")
        return Decoded(CallRequest(conversation=history.conversation(None), sampling={"max_new_tokens": 8}))

    def encode(self, answer: CallAnswer, decoded: Decoded, context: Context) -> Any:
        return {"heard": answer.content, "ids": answer.tito["output_ids"]}

    def events(self, answer: CallAnswer, decoded: Decoded, context: Context) -> list[Event]:
        return [Event({"heard": answer.content})]

    def error(self, error: GatewayError) -> Any:
        return {"echo_error": error.message, "field": error.param}


class EchoPlugin:
    @hookimpl
    def tito_fronts(self) -> Any:
        yield FrontSpec("echo", Echo, "a toy front")


async def test_a_plugin_front_is_served_and_recorded(backend: Any, qwen3_tokenizer: Any) -> None:
    backend.add("hello back")
    with temporary_plugin(EchoPlugin()):
        gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend)
        base = await gateway.start()
    try:
        assert [f.name for f in gateway.fronts] == ["chat_completions", "echo", "gemini", "messages", "responses"]
        rollout = gateway.open()
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{base}/v1/echo", json={"say": "hi"}, headers={"x-echo-key": rollout.token}) as r:
                assert r.status == 200, await r.text()
                answer = await r.json()
            async with http.post(f"{rollout.base_url.removesuffix('/v1')}/v1/echo", json={"say": 3},
                                 headers={"x-echo-key": rollout.token}) as r:  # fmt: skip
                assert (r.status, await r.json()) == (400, {"echo_error": "say: must be a string", "field": "say"})
        traj = await gateway.take(rollout.id)
        turn = traj.turns[0]
        assert answer["heard"] == "hello back"
        assert traj.token_ids[turn.prompt_start + turn.prompt_len :] == answer["ids"]
    finally:
        await gateway.close()


async def test_gateway_serves_the_fronts_it_is_asked_for(backend: Any, qwen3_tokenizer: Any) -> None:
    gateway = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, fronts=["messages"])
    base = await gateway.start()
    try:
        rollout = gateway.open()
        async with aiohttp.ClientSession() as http:
            body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
            headers = {"Authorization": f"Bearer {rollout.token}"}
            async with http.post(f"{base}/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 404
    finally:
        await gateway.close()
