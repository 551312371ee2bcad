"""The agent loop verl instantiates: a Strands agent on a :class:`~tito_core.TitoModel` over verl's servers.

This module imports verl (``AgentLoopBase`` must be subclassed at import time, and verl's registry and
``agent_loop_config_path`` name classes by import path); import it only where verl is installed. Register
it with :func:`tito_core.trainers.verl.register_agent_loop` or a YAML entry::

    - name: tito
      _target_: tito_core.trainers.verl_agent_loop.TitoAgentLoop
      rollout: my_pkg.agents.solve      # async def solve(model, **row) -> float | None

The rollout function gets the ``TitoModel`` and the dataset row's fields (``raw_prompt``, ``extra_info``,
...), runs its agent, and returns the reward (or None to leave scoring to verl's reward loop).

Images: the processor verl gives agent loops (a vision-language model's Hugging Face processor) becomes the
model's vision processor, and its chat template the model's, as in verl's own loops; the row's images sit
in ``raw_prompt``'s image parts (:func:`tito_core.trainers.verl_images.strands_content` makes them Strands
content blocks). The output's ``multi_modal_data`` holds every image of the ids, in token order.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase

from ..errors import ConfigError
from ..media.processor import DEFAULT_MAX_IMAGES
from ..model_setup import vision_processor
from ..strands_front.model import TitoModel
from .verl_backend import VerlServerBackend, agent_loop_output

logger = logging.getLogger(__name__)

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
        model_options: More :class:`~tito_core.TitoModel` options (``chat_template_kwargs``, ...). Unless they
            set ``processor`` / ``chat_template``, verl's processor gives both (its image processor, its
            template); a processor of a family tito does not know leaves the model text-only (logged).
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
        self.model_options.update(self._vision_options())

    def _vision_options(self) -> dict[str, Any]:
        """``processor`` and ``chat_template`` from verl's processor (None for a text-only model)."""
        processor: Any = self.processor
        if processor is None:
            return {}
        options: dict[str, Any] = {}
        template = getattr(processor, "chat_template", None)
        if isinstance(template, str) and "chat_template" not in self.model_options:
            options["chat_template"] = template
        if "processor" not in self.model_options:
            image_processor = getattr(processor, "image_processor", None) or processor
            max_images = self.model_options.get("max_images", DEFAULT_MAX_IMAGES)
            try:
                options["processor"] = vision_processor(image_processor, self.tokenizer, max_images=max_images)
            except ConfigError as exc:
                logger.warning("TitoAgentLoop: images are off (%s)", exc)
                options["processor"] = False
        return options

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
