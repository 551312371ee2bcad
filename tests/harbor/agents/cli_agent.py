"""Codex CLI or Claude Code, unmodified, as the ``[rollout.agent]`` command of a Harbor rollout.

``cli_agent.py codex`` runs ``codex exec`` with a model provider at the rollout's ``OPENAI_BASE_URL`` whose key
is its ``OPENAI_API_KEY`` (Codex speaks the Responses API); ``cli_agent.py claude`` runs ``claude -p``, which reads
``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` itself (the Messages API). The executables come in
``TITO_CODEX`` / ``TITO_CLAUDE``; the task's instruction in ``TITO_TASK``. Both keep their settings under
``HOME``, the sandbox's own. Codex's own sandbox is bypassed: the rollout's bubblewrap sandbox is the one.
The CLI's exit code is this script's; its last output line is the answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def main() -> None:
    which = sys.argv[1]
    prompt = json.loads(os.environ["TITO_TASK"])["prompt"]
    env = dict(os.environ)
    if which == "codex":
        home = os.path.join(os.environ["HOME"], ".codex")
        os.makedirs(home, exist_ok=True)
        provider = f'{{name="tito", base_url="{os.environ["OPENAI_BASE_URL"]}", env_key="OPENAI_API_KEY", ' + (
            'wire_api="responses"}'
        )
        command = [os.environ["TITO_CODEX"], "exec", "--skip-git-repo-check", "-m", "tito",
                   "-c", 'model_provider="tito"', "-c", f"model_providers.tito={provider}",
                   "--disable", "multi_agent", "--disable", "goals", "-c", 'web_search="disabled"',
                   "--dangerously-bypass-approvals-and-sandbox", prompt]  # fmt: skip
        env["CODEX_HOME"] = home
    else:
        command = [os.environ["TITO_CLAUDE"], "-p", prompt, "--model", "tito", "--allowedTools", "Bash"]
        env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"  # no telemetry, no update checks: offline
    done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    sys.stderr.write(done.stderr[-4000:])
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:])
        raise SystemExit(done.returncode)
    print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "")


if __name__ == "__main__":
    main()
