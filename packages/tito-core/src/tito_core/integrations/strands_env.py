"""strands-env on tito, both ways round.

**strands-env drives** (its ``Environment.rollout`` and ``Evaluator``): :func:`model_factory` (or
:func:`config_model_factory`) is the ``model_factory`` an environment takes. Each call builds a fresh
:class:`StrandsEnvModel` on one shared tito backend, any backend. After the agent ran, the environment reads
``model.rollout`` (put into ``RolloutResult.rollout``) and ``model.tool_parse_errors`` (its tool metrics), as it
does from strands-sglang's ``SGLangModel``: both come from the tito trajectory. The ``rollout`` is a
strands-sglang ``Rollout`` (``token_ids``, ``loss_mask``, ``logprobs``, ``segment_info``) that also carries
the whole tito trajectory record (:func:`trajectory_of` rebuilds it: turns, statuses, branches).

**tito drives** (``tito rollout``): :class:`EnvironmentAdapter` shows an environment's tools, system prompt,
loop limits and reward function to the runner's config by import path, and turns strands-env ``Task`` objects
into the runner's tasks (:meth:`EnvironmentAdapter.tasks`; :func:`write_tasks` for a dataset file)::

    # my_env.py
    from strands_env.environments.math import MathEnv
    from tito_core.integrations.strands_env import EnvironmentAdapter

    env = EnvironmentAdapter(MathEnv)

    # tito.toml
    [rollout]
    tools = ["my_env:env.tools"]
    reward = "my_env:env.reward"      # the environment's RewardFunction, per rollout
    prepare = "my_env:env.prepare"    # its system prompt and loop limits

strands-env is imported only when one of these needs it (``pip install strands-env``, Python >= 3.12).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from ..backend import Backend
from ..config import TitoConfig, load_config
from ..errors import ConfigError, DatasetError
from ..runner.dataset import Task, task_from_row
from ..runner.rewards import RewardFn, Sample
from ..strands_front.model import TitoModel
from ..tokenizers import load_tokenizer
from ..trajectory import Trajectory, TrajectoryRecord

__all__ = [
    "EnvironmentAdapter",
    "StrandsEnvModel",
    "config_model_factory",
    "env_task",
    "model_factory",
    "reward_function",
    "termination_reason",
    "to_sglang_rollout",
    "to_tasks",
    "trajectory_of",
    "write_tasks",
]

logger = logging.getLogger("tito.integrations.strands_env")

_TASK_KEY = "strands_env_task"
"""The metadata key under which a task converted by :func:`to_tasks` keeps the strands-env task itself."""


def _import(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"{module} is not installed: `pip install strands-env` (Python >= 3.12) to use "
            f"tito_core.integrations.strands_env ({exc})"
        ) from exc


# --------------------------------------------------------------------------------- strands-env drives
@functools.cache
def _rollout_class() -> Any:
    """strands-sglang's ``Rollout`` with one more field: the tito trajectory record (built once)."""
    rollout_cls = _import("strands_sglang").Rollout
    pydantic = _import("pydantic")

    class TitoRollout(rollout_cls):  # type: ignore[misc,valid-type]
        """A strands-sglang ``Rollout`` built from a tito trajectory, which it keeps as ``trajectory``."""

        trajectory: dict[str, Any] | None = pydantic.Field(
            default=None, description="The tito trajectory record (tito_core.trajectory.TrajectoryRecord)."
        )

    return TitoRollout


def to_sglang_rollout(traj: Trajectory) -> Any:
    """The trajectory's current branch as a strands-sglang ``Rollout``, the token-level result strands-env keeps.

    ``token_ids``, ``loss_mask`` and ``logprobs`` are the trajectory's own; ``segment_info`` lists
    ``(is_output, length)`` with template boundary tokens counted as prompt (loss 0), consecutive segments of
    one kind merged, as strands-sglang records them. The rollout's ``trajectory`` field holds the whole tito
    record (:func:`trajectory_of`). Routed experts are not converted (tito keeps them as one array).
    """
    segment_info: list[tuple[bool, int]] = []
    for seg in traj.segments:
        output = seg.kind == "output"
        if segment_info and segment_info[-1][0] == output:
            segment_info[-1] = (output, segment_info[-1][1] + seg.length)
        else:
            segment_info.append((output, seg.length))
    return _rollout_class()(
        token_ids=traj.token_ids,
        loss_mask=traj.loss_mask,
        logprobs=traj.logprobs,
        segment_info=segment_info,
        trajectory=msgspec.to_builtins(traj.to_record()),
    )


def trajectory_of(result: Any) -> Trajectory | None:
    """The tito trajectory of a strands-env ``RolloutResult`` (or of its ``rollout``); None when it has none."""
    rollout = getattr(result, "rollout", result)
    record = getattr(rollout, "trajectory", None)
    if record is None:
        return None
    return Trajectory.from_record(msgspec.convert(record, TrajectoryRecord))


class StrandsEnvModel(TitoModel):
    """A :class:`~tito_core.TitoModel` that also shows what strands-env reads from a model after a rollout."""

    @property
    def rollout(self) -> Any:
        """The live trajectory as a strands-sglang ``Rollout`` (:func:`to_sglang_rollout`)."""
        return to_sglang_rollout(self.trajectory)

    @property
    def tool_parse_errors(self) -> dict[str, int]:
        """Malformed tool calls per tool name in this rollout (strands-env's ``parse_errors`` tool metric)."""
        return dict(self.trajectory.tool_parse_errors)


ModelFactory = Callable[[], StrandsEnvModel]
"""strands-env's ``ModelFactory``: a fresh model per call (one per rollout)."""


def model_factory(backend: Backend | str, tokenizer: Any, **options: Any) -> ModelFactory:
    """strands-env's ``model_factory`` on any tito backend: a fresh :class:`StrandsEnvModel` per call.

    Args:
        backend: A backend, shared by every model; or a backend name, built once here with
            ``options["backend_options"]``.
        tokenizer: A tokenizer, or its directory / hub name (loaded once here).
        **options: :class:`~tito_core.TitoModel` keywords (``tool_parser``, ``sampling``, ``chat_template``, ...).

    Raises:
        ConfigError: A bad backend, tokenizer or model option (found here, by building one model).
    """
    if isinstance(backend, str):
        from ..plugins import get_backend

        backend = get_backend(backend, **dict(options.pop("backend_options", None) or {}))
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(tokenizer)
    shared: Backend = backend

    def make() -> StrandsEnvModel:
        return StrandsEnvModel(shared, tokenizer, **options)

    make()  # a bad option fails now, not in every rollout
    return make


def config_model_factory(config: TitoConfig | str | os.PathLike[str] | Mapping[str, Any]) -> ModelFactory:
    """strands-env's ``model_factory`` from a tito config (a TOML file, a mapping or a :class:`TitoConfig`).

    The backend and tokenizer are built once and shared; each call builds a fresh :class:`StrandsEnvModel`.

    Raises:
        ConfigError: A bad config, a missing tokenizer, or several servers in ``backend_options.base_url``
            (only ``tito rollout`` routes between servers).
    """
    resolved = config if isinstance(config, TitoConfig) else load_config(config)
    if resolved.tokenizer is None:
        raise ConfigError("`tokenizer` is not set: give the tokenizer's directory or name in the config")
    backend = resolved.create_backend()
    tokenizer = load_tokenizer(resolved.tokenizer)

    def make() -> StrandsEnvModel:
        model = resolved.create_model(backend, tokenizer=tokenizer, model_class=StrandsEnvModel)
        assert isinstance(model, StrandsEnvModel)
        return model

    make()
    return make


# --------------------------------------------------------------------------------------- tito drives
def termination_reason(status: str, reason: str | None) -> Any:
    """strands-env's ``TerminationReason`` for a tito rollout's status and reason."""
    reasons = _import("strands_env.core.types").TerminationReason
    text = (reason or "").lower()
    if status == "completed":
        return reasons.TASK_COMPLETE
    if status == "truncated":
        for needle, value in (
            ("max_tool_calls", reasons.MAX_TOOL_CALLS_REACHED),
            ("max_messages", reasons.MAX_MESSAGES_REACHED),
            ("max_model_calls", reasons.MAX_TOOL_ITERATIONS_REACHED),
            ("context", reasons.CONTEXT_WINDOW_OVERFLOW),
        ):
            if needle in text:
                return value
        return reasons.MAX_TOKENS_REACHED
    if "timed out" in text or "timeout" in text:
        return reasons.TIMEOUT
    if "connection" in text:
        return reasons.CONNECTION_ERROR
    return reasons.UNCLASSIFIED_ERROR


def _text(content: Any, where: str) -> str:
    """The text of a Strands message's content (text blocks only)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content or []:
        if not isinstance(block, Mapping) or set(block) != {"text"}:
            kinds = sorted(block) if isinstance(block, Mapping) else [type(block).__name__]
            raise DatasetError(f"{where}: a {'/'.join(kinds)} block; tito rollout prompts hold text only")
        parts.append(str(block["text"]))
    return "".join(parts)


def to_tasks(tasks: Iterable[Any]) -> list[Task]:
    """The runner's tasks for strands-env ``Task`` objects, in order.

    ``id`` is kept, ``message`` and ``conversation_history`` (text only) become the prompt, ``ground_truth``
    the ``answer``; the whole task (subclass fields included) travels in ``metadata["strands_env_task"]``, so
    :func:`reward_function` hands the reward the task it was given.

    Raises:
        DatasetError: A task whose message or history holds something other than text, or a repeated id.
    """
    converted: list[Task] = []
    seen: set[str] = set()
    for index, task in enumerate(tasks):
        where = f"strands-env task {index + 1} ({task.id!r})"
        if task.id in seen:
            raise DatasetError(f"{where}: the id repeats an earlier task")
        seen.add(task.id)
        message = task.message if isinstance(task.message, str) else _text(task.message.get("content"), where)
        history = [
            {"role": m["role"], "content": _text(m.get("content"), f"{where}: conversation_history[{n}]")}
            for n, m in enumerate(task.conversation_history)
        ]
        prompt: Any = [*history, {"role": "user", "content": message}] if history else message
        dumped = task.model_dump(mode="json")
        row = {"id": task.id, "prompt": prompt, "answer": dumped.get("ground_truth"), "metadata": {_TASK_KEY: dumped}}
        converted.append(task_from_row(row, index, where="strands-env tasks"))
    if not converted:
        raise DatasetError("strands-env tasks: no tasks")
    return converted


def write_tasks(tasks: Iterable[Any], path: str | os.PathLike[str]) -> Path:
    """Write strands-env ``Task`` objects as a ``tito rollout`` dataset (JSON lines, :func:`to_tasks` rows)."""
    target = Path(path)
    rows = [{"id": t.id, "prompt": t.prompt, "answer": t.answer, "metadata": t.metadata} for t in to_tasks(tasks)]
    target.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return target


def env_task(task: Task, task_cls: Any = None) -> Any:
    """The strands-env task of a runner task: the one :func:`to_tasks` kept, else one built from its fields."""
    cls = task_cls if task_cls is not None else _import("strands_env.core.types").Task
    kept = task.metadata.get(_TASK_KEY)
    if isinstance(kept, Mapping):
        return cls.model_validate(kept)
    if isinstance(task.prompt, str):
        message, history = task.prompt, []
    else:
        message = task.prompt[-1]["content"]
        history = [{"role": m["role"], "content": [{"text": m["content"]}]} for m in task.prompt[:-1]]
        history = [m for m in history if m["role"] != "system"]
    return cls.model_validate(
        {**task.metadata, "id": task.id, "message": message, "ground_truth": task.answer,
         "conversation_history": history}
    )  # fmt: skip


def reward_function(reward_fn: Any, *, task_cls: Any = None) -> RewardFn:
    """A runner reward function (``reward(sample) -> float``) computing a strands-env ``RewardFunction``.

    The reward gets the strands-env task (:func:`env_task`) and a ``RolloutResult`` with the rollout's new
    messages (after the prompt's history), its ``rollout`` (:func:`to_sglang_rollout`) and its
    ``termination_reason`` (:func:`termination_reason`); the rollout's reward is ``RewardResult.reward``
    (its ``info`` is logged at debug level, the rollout file has no place for it).

    Raises:
        ConfigError: ``reward_fn`` has no ``compute`` method.
    """
    if not callable(getattr(reward_fn, "compute", None)):
        raise ConfigError(f"a strands-env RewardFunction has an async `compute(task, result)`; got {reward_fn!r}")
    result_cls = _import("strands_env.core.types").RolloutResult

    async def reward(sample: Sample) -> float:
        prompt = sample.task.prompt  # the agent's messages start with the prompt's history (system aside)
        history = 0 if isinstance(prompt, str) else sum(1 for m in prompt[:-1] if m["role"] != "system")
        result = result_cls(
            messages=list(sample.messages)[history:],
            rollout=to_sglang_rollout(sample.trajectory),
            termination_reason=termination_reason(sample.status, sample.status_reason),
        )
        outcome = await reward_fn.compute(env_task(sample.task, task_cls), result)
        logger.debug("reward of %s:%s: %s %s", sample.task.id, sample.sample, outcome.reward, outcome.info)
        return float(outcome.reward)

    return reward


def _refusing_factory() -> Any:
    raise ConfigError("EnvironmentAdapter's environment builds no model: tito rollout builds the agent")


class EnvironmentAdapter:
    """A strands-env ``Environment`` as the tools, system prompt, loop limits, reward and tasks of ``tito rollout``.

    The runner builds each rollout's agent itself, with the environment's tools: an environment whose episode
    needs its own code (an overridden ``reset`` or ``_rollout``, hooks, a conversation manager) is refused;
    run it with :func:`model_factory` under strands-env's ``Evaluator`` instead.

    Args:
        environment: An ``Environment`` instance (its model factory is never called), or an ``Environment``
            class, built here with ``options``.
        **options: Keyword arguments of the class (``reward_fn``, ``system_prompt``, ``max_tool_calls``, ...).

    Raises:
        ConfigError: Not a strands-env environment, or one whose episode the runner cannot reproduce.
    """

    def __init__(self, environment: Any, **options: Any) -> None:
        base = _import("strands_env.core.environment").Environment
        if isinstance(environment, type) and issubclass(environment, base):
            environment = environment(model_factory=_refusing_factory, **options)
        elif options:
            raise ConfigError("options are for an Environment class; this environment is already built")
        if not isinstance(environment, base):
            raise ConfigError(f"not a strands-env Environment: {environment!r}")
        custom = [
            name
            for name in ("reset", "_rollout", "get_hooks", "get_conversation_manager")
            if getattr(type(environment), name) is not getattr(base, name)
        ]
        if custom:
            raise ConfigError(
                f"{type(environment).__name__} overrides {', '.join(custom)}: tito rollout cannot run its episode;"
                " use tito_core.integrations.strands_env.model_factory with strands-env's Evaluator"
            )
        if environment.max_parallel_tool_calls is not None:
            logger.warning("tito rollout has no max_parallel_tool_calls: the environment's limit is not applied")
        self.environment = environment

    @property
    def tools(self) -> list[Any]:
        """The environment's tools (name it in ``rollout.tools``: a list is accepted as one entry)."""
        return list(self.environment.get_tools())

    @property
    def reward(self) -> RewardFn:
        """The environment's reward function as a runner reward (:func:`reward_function`).

        Raises:
            ConfigError: The environment has no reward function.
        """
        if self.environment.reward_fn is None:
            raise ConfigError(f"{type(self.environment).__name__} has no reward function (reward_fn is None)")
        return reward_function(self.environment.reward_fn, task_cls=self.environment.task_cls)

    def prepare(self) -> dict[str, Any]:
        """Config keys from the environment, for ``rollout.prepare``: its system prompt and loop limits.

        ``max_tool_iters`` becomes ``max_model_calls`` (both end the rollout ``truncated`` before the model call
        after that many tool rounds); None values leave the config's own.
        """
        env = self.environment
        return {
            "system_prompt": env.system_prompt,
            "max_model_calls": env.max_tool_iters,
            "max_tool_calls": env.max_tool_calls,
            "max_messages": env.max_messages,
        }

    def tasks(self, tasks: Iterable[Any]) -> list[Task]:
        """The runner's tasks for strands-env tasks (:func:`to_tasks`); mappings are read as its task class."""
        cls = self.environment.task_cls
        return to_tasks(cls.model_validate(t) if isinstance(t, Mapping) else t for t in tasks)
