"""Integrations with RL trainers, one module per trainer: what runs inside a trainer (docs/exports.md).

A trajectory as a trainer's data is :mod:`tito_core.export`'s job; these use it.

None of them is imported by ``tito_core``, and none imports its trainer at import time: the trainer
package is needed only by the functions that build its own classes.

- :mod:`tito_core.trainers.trl`: a ``rollout_func`` for TRL's ``GRPOTrainer``.
- :mod:`tito_core.trainers.verl`: verl's ``AgentLoopOutput``, a tito backend over verl's server manager,
  and :mod:`tito_core.trainers.verl_agent_loop` (the agent loop class verl instantiates).
- :mod:`tito_core.trainers.agentlightning`: posting Agent Lightning v1 ``model_request`` / ``reward`` events
  (their format is :mod:`tito_core.export.agentlightning`'s) and an agent class for its local runner.
- :mod:`tito_core.trainers.slime`: slime's generate hook (its backend for slime's router is the SGLang
  adapter's, :mod:`tito_sglang.slime`).
"""
