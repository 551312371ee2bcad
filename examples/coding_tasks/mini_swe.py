"""mini-swe-agent as a `[rollout.agent]` command: its `mini` CLI on the task's prompt, through LiteLLM.

The runner gives OPENAI_BASE_URL and OPENAI_API_KEY (the rollout's), which LiteLLM's `openai/` provider reads;
the task comes in TITO_TASK; TITO_MINI names the `mini` executable (default: `mini` on PATH). LiteLLM's cost map
stays local (no network) and cost tracking ignores the unknown model. The last line printed is the agent's exit
status and submission (the answer a reward function sees; a Harbor task's verifier reads the files instead).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def main() -> None:
    task = json.loads(os.environ["TITO_TASK"])
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_COST_TRACKING": "ignore_errors",
           "MSWEA_CONFIGURED": "true"}  # fmt: skip
    command = [os.environ.get("TITO_MINI", "mini"), "-m", "openai/tito", "-t", task["prompt"], "-y", "-l", "0",
               "--exit-immediately", "-o", "mini-trajectory.json"]  # fmt: skip
    done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    sys.stderr.write(done.stderr[-4000:])
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:])
        raise SystemExit(done.returncode)
    with open("mini-trajectory.json") as file:
        info = json.load(file).get("info", {})
    print(info.get("exit_status"), info.get("submission", "").strip())


if __name__ == "__main__":
    main()
