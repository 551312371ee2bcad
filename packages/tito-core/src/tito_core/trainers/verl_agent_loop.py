"""The agent loop verl instantiates: a Strands agent on a :class:`~tito_core.TitoModel` over verl's servers.

This module imports verl (``AgentLoopBase`` must be subclassed at import time, and verl's registry and
``agent_loop_config_path`` name classes by import path); import it only where verl is installed. Register
it with :func:`tito_core.trainers.verl.register_agent_loop` or a YAML entry::

    - name: tito
      _target_: tito_core.trainers.verl_agent_loop.TitoAgentLoop
      rollout: my_pkg.agents.solve      # async def solve(model, **row) -> float | None

The rollout function gets the ``TitoModel`` and the dataset row's fields (``raw_prompt``, ``extra_info``,
...), runs its agent, and returns the reward (or None to leave scoring to verl's reward loop).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase

from ..model import TitoModel
from .verl_backend import VerlServerBackend, agent_loop_output

AgentRollout = Callable[..., Awaitable[float | None]]


def _resolve(rollout: AgentRollout | str) -> AgentRollout:
    if not isinstance(rollout, str):
        return rollout
    module, sep, name = rollout.replace(":", ".").rpartition(".")
    if not sep or not module:
        raise ValueError(f"rollout must be a dotted path `package.module.function`, got {rollout!r}")
    fn: AgentRollout = getattr(importlib.import_module(module), name)
    return fn


class TitoAgentLoop(AgentLoopBase):
    """verl agent loop running ``rollout(model, **row)`` on a fresh :class:`~tito_core.TitoModel`.

    Args:
        rollout: The rollout function or its dotted path (a YAML option). When None, each row names it
            in ``extra_info["tito_rollout"]``.
        tool_parser: The :class:`~tito_core.TitoModel` tool parser.
        model_options: More :class:`~tito_core.TitoModel` options (``chat_template_kwargs``, ...).
        *args: What verl passes to every agent loop (``AgentLoopBase``'s arguments).
        **kwargs: The same, by name.
    """

    def __init__(
        self,
        *args: Any,
        rollout: AgentRollout | str | None = None,
        tool_parser: str = "hermes",
        model_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.rollout = _resolve(rollout) if rollout is not None else None
        self.tool_parser = tool_parser
        self.model_options = dict(model_options or {})
        self.response_length: int | None = self.rollout_config.get("response_length")

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        """Run the agent for one dataset row; its trajectory becomes the ``AgentLoopOutput``."""
        rollout = self.rollout
        if rollout is None:
            name = (kwargs.get("extra_info") or {}).get("tito_rollout")
            if not name:
                raise ValueError("TitoAgentLoop needs `rollout=` (YAML option) or extra_info['tito_rollout']")
            rollout = _resolve(name)
        backend = VerlServerBackend(self.server_manager, sampling_params)
        tokenizer: Any = self.tokenizer  # a Hugging Face tokenizer (verl annotates it AutoTokenizer)
        model = TitoModel(
            backend,
            tokenizer,
            tool_parser=self.tool_parser,
            **self.model_options,
        )
        started = time.perf_counter()
        reward = await rollout(model, **kwargs)
        elapsed = time.perf_counter() - started
        return agent_loop_output(
            model.reset(),
            reward_score=reward,
            metrics={"generate_sequences": backend.generate_seconds, "tool_calls": elapsed - backend.generate_seconds},
            response_length=self.response_length,
        )
