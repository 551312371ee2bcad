"""A plain `anthropic` SDK agent: a hand-written tool loop over the Messages API (the runner's `command` agent).

It stands in for the Claude Agent SDK, whose `claude` CLI (npm) is not run here; it sends what an Anthropic client
sends: a system prompt as text blocks, custom tools with an input_schema, the assistant's blocks replayed, and
tool_result blocks.
"""

from __future__ import annotations

import json
import os

from anthropic import Anthropic

TOOLS = [
    {
        "name": "add",
        "description": "Add two integers.",
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    }
]
SYSTEM = [{"type": "text", "text": "Use the add tool for every sum.", "cache_control": {"type": "ephemeral"}}]


def main() -> None:
    task = json.loads(os.environ["TITO_TASK"])
    client = Anthropic(max_retries=0)  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY come from the runner
    messages: list[dict] = [{"role": "user", "content": task["prompt"]}]
    for _ in range(4):
        reply = client.messages.create(model="tito", max_tokens=256, system=SYSTEM, messages=messages, tools=TOOLS)
        messages.append(
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in reply.content]}
        )
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            print("".join(block.text for block in reply.content if block.type == "text"))
            return
        results = [
            {"type": "tool_result", "tool_use_id": use.id, "content": str(use.input["a"] + use.input["b"])}
            for use in uses
        ]
        messages.append({"role": "user", "content": results})
    raise SystemExit("no answer after 4 calls")


if __name__ == "__main__":
    main()
