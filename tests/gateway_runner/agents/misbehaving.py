"""An agent that misbehaves as its task's ``metadata.mode`` says, after one model call (standard library only: it
starts fast, so its time limit can be short).

- ``crash``: writes a long standard error, then exits 3;
- ``hang``: starts a child in its process group (its pid and the child's written to ``$PID_FILE``), then waits forever;
- ``flood``: writes 3 MB to standard error and 3 MB to standard output, then answers;
- ``quiet``: answers, with a few lines of standard output before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request


def chat(prompt: str) -> str:
    body = json.dumps({"model": "tito", "messages": [{"role": "user", "content": prompt}]}).encode()
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
    )
    with urllib.request.urlopen(request) as response:
        return json.load(response)["choices"][0]["message"]["content"]


def main() -> None:
    task = json.loads(os.environ["TITO_TASK"])
    answer = chat(task["prompt"])
    mode = task["metadata"]["mode"]
    if mode == "crash":
        sys.stderr.write("noise\n" * 20_000 + "Traceback: the tool server is gone\nfatal: boom\n")
        raise SystemExit(3)
    if mode == "hang":
        child = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])
        with open(os.environ["PID_FILE"] + ".part", "w") as f:
            f.write(f"{os.getpid()} {child.pid}")
        os.replace(os.environ["PID_FILE"] + ".part", os.environ["PID_FILE"])  # whole when it appears
        threading.Event().wait()
    if mode == "flood":
        sys.stderr.write("e" * 3_000_000 + "\n")
        sys.stdout.write(("o" * 999 + "\n") * 3_000)
    print("some log line\n\n")
    print(f"  {answer}  \n\n")


if __name__ == "__main__":
    main()
