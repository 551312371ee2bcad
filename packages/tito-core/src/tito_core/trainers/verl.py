"""verl: a tito trajectory as verl's ``AgentLoopOutput``, and a tito backend over verl's server manager.

verl runs agent loops (``AgentLoopBase`` subclasses, registered by name) that generate token-in/token-out
through ``server_manager.generate(request_id, prompt_ids=..., sampling_params=...)``.
:class:`VerlServerBackend` makes that call a tito :class:`~tito_core.backend.Backend`, so a Strands agent on
a :class:`~tito_core.TitoModel` runs on verl's own inference servers;
:class:`tito_core.trainers.verl_agent_loop.TitoAgentLoop` is the agent loop. verl is imported only by
:func:`agent_loop_output` and :func:`register_agent_loop`.

This module's own job is :func:`register_agent_loop`; the backend and :func:`agent_loop_output` live in
``tito_core.trainers.verl_backend`` (re-exported here), which the agent loop imports, so that the agent
loop and its registration do not import each other. A row's images (``raw_prompt``'s image parts) become
Strands content or chat messages with ``tito_core.trainers.verl_images`` (re-exported here).
"""

from __future__ import annotations

from typing import Any

from .verl_backend import VerlServerBackend, agent_loop_output
from .verl_images import chat_messages, strands_content, verl_image

__all__ = [
    "VerlServerBackend",
    "agent_loop_output",
    "chat_messages",
    "register_agent_loop",
    "strands_content",
    "verl_image",
]


def register_agent_loop(name: str = "tito") -> type[Any]:
    """Register :class:`~tito_core.trainers.verl_agent_loop.TitoAgentLoop` in verl's agent-loop registry.

    Equivalent to an ``agent_loop_config_path`` YAML entry ``{name: tito, _target_:
    tito_core.trainers.verl_agent_loop.TitoAgentLoop, rollout: my_pkg.my_module.my_rollout}``; with the
    registry, the ``rollout`` option comes from the dataset row's ``extra_info`` or the class default.
    """
    from verl.experimental.agent_loop.agent_loop import register

    from .verl_agent_loop import TitoAgentLoop

    registered: type[Any] = register(name)(TitoAgentLoop)
    return registered
