"""A stand-in for ``tito_core.gateway`` (issue 30 item 1) while it is being built: the same Python API, the least
of its behaviour (non-streaming chat completions, tools, a Bearer route), to develop the runner's agent path
against. It is installed as ``tito_core.gateway`` only when the real one cannot be imported.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tito_core.conversation import Conversation
from tito_core.trajectory import Trajectory


@dataclass
class GatewayRollout:
    id: str
    base_url: str


class Gateway:
    def __init__(self, config: Any, *, tokenizer: Any = None, backend: Any = None, **_: Any) -> None:
        self.config, self.tokenizer, self.backend = config, tokenizer, backend
        self._models: dict[str, Any] = {}
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application()
        app.router.add_post("/rollouts/{id}/v1/chat/completions", self._chat)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        return self.url

    def open(self, task_id: Any = None, metadata: Any = None, rollout_id: str | None = None) -> GatewayRollout:
        rid = rollout_id or uuid.uuid4().hex
        self._models[rid] = self.config.create_model(self.backend, tokenizer=self.tokenizer, rollout_id=rid)
        return GatewayRollout(rid, f"{self.url}/rollouts/{rid}/v1")

    async def take(self, rollout_id: str) -> Trajectory:
        model = self._models.pop(rollout_id)
        closed: Trajectory = model.reset()
        return closed

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _chat(self, request: web.Request) -> web.Response:
        rid = request.match_info.get("id") or request.headers.get("Authorization", "").removeprefix("Bearer ")
        model = self._models.get(rid)
        if model is None:
            return web.json_response({"error": {"message": f"unknown rollout {rid}"}}, status=404)
        body = await request.json()
        system, messages = None, []
        for m in body["messages"]:
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content)
            if m["role"] in ("system", "developer"):
                system = content
            elif m["role"] == "assistant":
                msg: dict[str, Any] = {"role": "assistant", "content": content or ""}
                if m.get("tool_calls"):
                    msg["tool_calls"] = [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {
                                "name": c["function"]["name"],
                                "arguments": json.loads(c["function"]["arguments"]),
                            },
                        }
                        for c in m["tool_calls"]
                    ]
                messages.append(msg)
            elif m["role"] == "tool":
                messages.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": content})
            else:
                messages.append({"role": "user", "content": content})
        specs = [
            {
                "name": t["function"]["name"],
                "description": t["function"].get("description", ""),
                "inputSchema": {"json": t["function"].get("parameters", {})},
            }
            for t in body.get("tools") or []
        ]
        conversation = Conversation(messages=messages, system=system, tool_specs=specs or None)
        try:
            result = await model._rollout.call(conversation, model._options)
        except Exception as exc:
            return web.json_response({"error": {"message": str(exc), "type": type(exc).__name__}}, status=500)
        parsed = result.parsed
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.input)}}
            for c in parsed.calls
        ]
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if calls:
            message["tool_calls"] = calls
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "tito"),
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": {
                    "prompt_tokens": result.usage.prompt_tokens,
                    "completion_tokens": result.usage.completion_tokens,
                    "total_tokens": result.usage.prompt_tokens + result.usage.completion_tokens,
                },
            }
        )
