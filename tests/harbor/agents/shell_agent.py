"""A minimal coding harness for the Harbor tests: chat completions with one ``bash`` tool, stdlib only.

It reads the rollout's ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (as any OpenAI client does) and the task in
``TITO_TASK``, runs each ``bash`` call in its working directory and sends the output back, until the model answers
without a tool call; it prints that answer. ``SHELL_AGENT_CRASH=N`` makes the rollout of sample ``N`` exit 3
after its first model call (a harness crash); ``SHELL_AGENT_TOOL_CHOICE=required`` makes its first call's
``tool_choice`` that (for a small model that writes no tool call unforced).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request


def chat(messages: list[dict[str, object]], tool_choice: str | None = None) -> dict[str, object]:
    tool = {"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}  # fmt: skip
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(
            {"model": "tito", "messages": messages, "tools": [tool], "tool_choice": tool_choice or "auto"}
        ).encode(),
        headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        message: dict[str, object] = json.load(response)["choices"][0]["message"]
    return message


def main() -> None:
    task = json.loads(os.environ["TITO_TASK"])
    messages: list[dict[str, object]] = [{"role": "user", "content": task["prompt"]}]
    for turn in range(8):
        message = chat(messages, os.environ.get("SHELL_AGENT_TOOL_CHOICE") if turn == 0 else None)
        crash = os.environ.get("SHELL_AGENT_CRASH")
        if crash and re.search(rf"(%3A|:){crash}/v1$", os.environ["OPENAI_BASE_URL"]):
            sys.stderr.write("shell agent: crashing as asked\n")
            raise SystemExit(3)
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            print(message.get("content") or "")
            return
        for call in calls:  # type: ignore[union-attr]
            command = json.loads(call["function"]["arguments"])["command"]
            # at most 64 KiB of output: a model's `yes` must not fill the machine's memory (the sandbox sets no limit)
            shell = ["bash", "-c", f"({command}) 2>&1 | head -c 65536"]
            done = subprocess.run(shell, capture_output=True, text=True, errors="replace", timeout=60)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": done.stdout})


if __name__ == "__main__":
    main()
