"""An agent that tries to reach another rollout from its sandbox, then reports what it found to its own rollout.

Both rollouts of its group meet at a barrier first (``PROBE_BARRIER``: a loopback port of the test's), so the
sibling is running while this one probes: the sibling's token in any process environment or command line it
can read, the sibling's trajectory and ``finish`` routes with its own token, the dataset's tests folder. The
findings go to the model as the user message of its one call: they are in the recorded trajectory.
"""

from __future__ import annotations

import glob
import json
import os
import re
import socket
import urllib.error
import urllib.request


def status(url: str, token: str, method: str) -> int:
    request = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None,
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def main() -> None:
    base, token = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
    with socket.create_connection(("127.0.0.1", int(os.environ["PROBE_BARRIER"])), timeout=120) as barrier:
        barrier.settimeout(120)
        barrier.recv(1)  # released once every rollout of the group is here
    sample = int(re.search(r"(?:%3A|:)(\d+)/v1$", base).group(1))  # type: ignore[union-attr]
    sibling = re.sub(r"(?:%3A|:)\d+/v1$", f"%3A{1 - sample}", base)
    tokens = set()
    for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as file:
                items = file.read().split(b"\0")
        except OSError:
            continue
        for at, item in enumerate(items):
            if item.startswith(b"OPENAI_API_KEY="):
                tokens.add(item.split(b"=", 1)[1].decode())
            elif item == b"OPENAI_API_KEY" and at + 1 < len(items):  # a variable set on a command line
                tokens.add(items[at + 1].decode())
    dataset = os.environ["PROBE_DATASET"]
    findings = {
        "other_tokens": sorted(tokens - {token}),
        "read_sibling": status(sibling, token, "GET"),
        "finish_sibling": status(sibling + "/finish", token, "POST"),
        "dataset_visible": sorted(os.listdir(dataset)) if os.path.isdir(dataset) else None,
        "tmp": sorted(os.listdir("/tmp")),
    }
    request = urllib.request.Request(
        base + "/chat/completions",
        data=json.dumps(
            {"model": "tito", "messages": [{"role": "user", "content": f"PROBE {json.dumps(findings)}"}]}
        ).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        print(json.load(response)["choices"][0]["message"]["content"])


if __name__ == "__main__":
    main()
