"""A plain `openai` SDK agent: a hand-written tool loop over chat completions (the runner's `command` agent)."""

from __future__ import annotations

import json
import os

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def main() -> None:
    task = json.loads(os.environ["TITO_TASK"])
    client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from the runner
    messages: list[dict] = [{"role": "user", "content": task["prompt"]}]
    for _ in range(4):
        reply = client.chat.completions.create(model="tito", messages=messages, tools=TOOLS).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            print("thinking done")
            print(reply.content)
            return
        for call in reply.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
    raise SystemExit("no answer after 4 calls")


if __name__ == "__main__":
    main()
