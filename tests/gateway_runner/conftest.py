"""The agent-runner suite: `tito rollout` with `[rollout.agent]` on the scripted backend, through the gateway."""
