"""One rollout, start to record: a fresh Strands agent (or any agent) on a leased server, limits, timeout, reward.

A ``[rollout.agent]`` config runs an agent of any framework through the gateway instead
(:mod:`~tito_core.runner.agent_process`); both kinds of rollout end in the same record
(:mod:`~tito_core.runner.finish`).

:class:`RolloutWorker` is what an executor runs: built once per process from a config
(:meth:`RolloutWorker.create` checks everything before any work), then :meth:`RolloutWorker.run` turns one
``(task, sample)`` into a :class:`~tito_core.records.RolloutRecord` whatever happens, except
cancellation (a cancelled rollout is in flight, and is not recorded).
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
from strands import Agent
from strands.agent.conversation_manager import NullConversationManager
from strands.types.content import Messages

from ..backend import Backend, GenerateRequest, GenerateResult
from ..config import TitoConfig
from ..errors import BackendConnectionError, ConfigError, LoopLimitError, TitoError
from ..plugins import get_backend, plugin_manager
from ..records import RolloutRecord
from ..status import RolloutTimedOut, replaces, status_of
from ..tokenizers import aload_tokenizer
from .agent_process import AgentRunner
from .dataset import Task, rollout_seed
from .finish import Ran, failed_record, rewarded_record
from .forcing import ForcedToolCalls
from .gateway_pool import NoGatewayWorker
from .limits import LoopLimiter
from .rewards import GroupRewardFn, RewardFn
from .servers import Server, ServerPool

__all__ = ["RolloutWorker", "conversation_manager", "import_object"]


def import_object(path: str, *, search: Path | None = None) -> Any:
    """Import ``"module:attribute"`` (``search``, e.g. the config file's directory, is tried as well)."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"{path!r} is not an import path of the form 'module:attribute'")
    if search is not None and str(search) not in sys.path:
        sys.path.append(str(search))
    try:
        value: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r} (from {path!r}): {exc}") from exc
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ConfigError(f"{module_name!r} has no attribute {attribute!r} (from {path!r})") from None
    return value


class RolloutWorker:
    """Runs rollouts on a pool of servers with one configuration.

    Args:
        config: The configuration (model keys and the ``[rollout]`` table).
        tokenizer: The loaded tokenizer, shared by every model.
        pool: The inference servers.
        tools: Strands tools given to every agent.
        reward: The reward function, or None.
        group_reward: The group reward function, or None.
        base_dir: The directory import paths were resolved from (the config file's), for workers built elsewhere.
        agents: Runs the rollouts of a ``[rollout.agent]`` config (None: Strands rollouts).
    """

    def __init__(
        self,
        config: TitoConfig,
        tokenizer: Any,
        pool: ServerPool,
        *,
        tools: Sequence[Any] = (),
        reward: RewardFn | None = None,
        group_reward: GroupRewardFn | None = None,
        base_dir: Path | None = None,
        agents: AgentRunner | None = None,
    ) -> None:
        self.config = config
        self.base_dir = base_dir
        self.settings = config.rollout
        self.tokenizer = tokenizer
        self.pool = pool
        self.tools = list(tools)
        self.reward = reward
        self.group_reward = group_reward
        if (agents is None) != (config.rollout.agent is None):
            raise ConfigError("`agents` runs the rollouts of a `[rollout.agent]` config, and only those")
        self.agents = agents

    @classmethod
    async def create(
        cls,
        config: TitoConfig,
        *,
        base_dir: Path | None = None,
        check_servers: bool = True,
        routes_only: bool = False,
        journals: Path | None = None,
    ) -> RolloutWorker:
        """Resolve a config: import tools and rewards, load the tokenizer, build and health-check the servers.

        With ``routes_only`` (the driver of an executor whose workers build their own backends, or a run whose
        ``[rollout.gateway]`` workers do), an in-process backend (an embedded model) is not built: the pool routes
        by its name, and generating through it is an error. ``journals``: the folder of the ``[rollout.gateway]``
        workers' journals (the runner's is beside its output).

        Raises:
            ConfigError: A bad import path, a missing tokenizer, a backend option its factory refuses.
            BackendConnectionError: A server does not answer its health check.
        """
        settings = config.rollout
        tools = [import_object(path, search=base_dir) for path in settings.tools]
        reward = import_object(settings.reward, search=base_dir) if settings.reward else None
        group_reward = import_object(settings.group_reward, search=base_dir) if settings.group_reward else None
        for name, fn in (("reward", reward), ("group_reward", group_reward)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"`rollout.{name}` must name a callable, got {type(fn).__name__}")
        conversation_manager(settings.conversation_manager, settings.conversation_manager_options, search=base_dir)
        if config.tokenizer is None:
            raise ConfigError("`tokenizer` is not set: give the tokenizer's directory or name in the config")
        tokenizer = await aload_tokenizer(config.tokenizer)
        agents = None
        if settings.agent is not None:
            fn = import_object(settings.agent.callable, search=base_dir) if settings.agent.callable else None
            agents = AgentRunner(config, tokenizer, fn=fn, base_dir=base_dir, journals=journals)
        pool = ServerPool(_backends(config, routes_only=routes_only), interval=settings.health_interval_s)
        if check_servers:
            try:
                await pool.require_all()
            except BaseException:
                await pool.aclose()
                raise
        return cls(
            config,
            tokenizer,
            pool,
            tools=tools,
            reward=reward,
            group_reward=group_reward,
            base_dir=base_dir,
            agents=agents,
        )

    def _conversation_manager(self) -> Any:
        """A fresh conversation manager for one agent (managers keep per-conversation state)."""
        settings = self.settings
        return conversation_manager(
            settings.conversation_manager, settings.conversation_manager_options, search=self.base_dir
        )

    async def aclose(self) -> None:
        """Stop health checks, close the agents' gateways and the backends."""
        try:
            if self.agents is not None:
                await self.agents.aclose()
        finally:
            await self.pool.aclose()

    async def run(
        self, task: Task, sample: int, on_start: Callable[[], None] | None = None, *, server: str | None = None
    ) -> RolloutRecord:
        """Run one rollout of ``task`` and return its record (rewarded, advantage not yet set).

        ``server`` names the pool's server to run on, when the rollout was routed elsewhere (see
        :meth:`~tito_core.runner.servers.ServerPool.lease`); by default the pool picks the least-loaded healthy one.
        """
        async with self.pool.lease(server) as leased:
            if on_start is not None:
                on_start()
            started = time.time()
            try:
                return await self._run_on(leased, task, sample)
            except NoGatewayWorker:  # no gateway serves the server any more: every rollout left would fail the same
                raise
            except Exception as exc:  # a bug or a bad option met while building this rollout: it alone fails
                return failed_record(task, sample, leased.name, started, exc)

    async def _run_on(self, server: Server, task: Task, sample: int) -> RolloutRecord:
        if self.agents is not None:
            traj, ran = await self.agents.run(server, task, sample)
            if ran.lost_engine:  # as below: the agent got a 503 from the gateway instead of the exception
                await self.pool.suspect(server)
            return await rewarded_record(task, sample, traj, ran, self.reward)
        settings = self.settings
        started, t0 = time.time(), time.perf_counter()
        model = self.config.create_model(server.backend, tokenizer=self.tokenizer, rollout_id=f"{task.id}:{sample}")
        if model.sampling.seed is not None:  # a seeded run: each rollout its own seed, the same on every rerun
            seed = rollout_seed(model.sampling.seed, task.id, sample)
            model.update_config(sampling=msgspec.structs.replace(model.sampling, seed=seed))
        limiter = LoopLimiter(
            max_model_calls=settings.max_model_calls,
            max_tool_calls=settings.max_tool_calls,
            max_messages=settings.max_messages,
        )
        system, history, prompt = _split_prompt(task.prompt, settings.system_prompt)
        history_options: dict[str, Any] = {"conversation_manager": self._conversation_manager()}
        if settings.context_manager is not None:
            history_options["context_manager"] = settings.context_manager
        agent = Agent(
            model=model,
            tools=list(self.tools),
            system_prompt=system,
            messages=history,
            callback_handler=None,
            hooks=[limiter, ForcedToolCalls(settings.forced_tool_calls, self.config.tool_choice)],
            **history_options,
        )
        text = ""
        ended: BaseException | RolloutTimedOut | None = None  # what ended the agent early, if anything did
        timeout = asyncio.timeout(settings.timeout_s)
        try:
            async with timeout:
                result = await agent.invoke_async(prompt)
            text = str(result).strip()
        except TimeoutError as exc:
            ended = RolloutTimedOut(settings.timeout_s or 0.0) if timeout.expired() else exc
        except Exception as exc:
            ended = _find(exc, LoopLimitError) or exc
            if ended is exc and _find(exc, BackendConnectionError) is not None:
                await self.pool.suspect(server)
        agent_s = time.perf_counter() - t0
        if ended is not None:  # how the agent ended decides every open branch's status where it replaces it
            for branch in model.trajectory.all_branches:
                if not branch.closed and replaces(ended, branch.status):
                    branch.close(*status_of(ended))
        traj = model.reset()
        ran = Ran(
            text=text,
            messages=agent.messages,
            server=server.name,
            started=started,
            t0=t0,
            agent_s=agent_s,
            tool_calls=limiter.tool_calls,
        )
        return await rewarded_record(task, sample, traj, ran, self.reward)


def conversation_manager(name: str, options: Mapping[str, Any], *, search: Path | None = None) -> Any:
    """A fresh Strands conversation manager: ``null``, ``sliding_window``, ``summarizing`` or an import path.

    Raises:
        ConfigError: Its options are not the manager's, or the import path does not give a callable.
    """
    from strands.agent.conversation_manager import (
        SlidingWindowConversationManager,
        SummarizingConversationManager,
    )

    factories: dict[str, Any] = {
        "null": NullConversationManager,
        "sliding_window": SlidingWindowConversationManager,
        "summarizing": SummarizingConversationManager,
    }
    factory = factories.get(name) or import_object(name, search=search)
    if not callable(factory):
        raise ConfigError(f"`rollout.conversation_manager` {name!r} is not callable")
    try:
        return factory(**options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"`rollout.conversation_manager` {name!r}: bad `conversation_manager_options`: {exc}"
        ) from exc


def _backends(config: TitoConfig, *, routes_only: bool = False) -> list[tuple[str, Any]]:
    """One backend per configured server: ``backend_options.base_url`` may be a list of URLs.

    With ``routes_only``, an in-process backend is a :class:`_BuiltElsewhere` stand-in named after it.
    """
    if routes_only:
        spec = plugin_manager().backends().get(config.backend.lower())
        if spec is not None and spec.in_process:
            return [(config.backend, _BuiltElsewhere(config.backend))]
    urls = config.backend_options.get("base_url")
    if isinstance(urls, list):
        if not urls or not all(isinstance(url, str) for url in urls):
            raise ConfigError("`backend_options.base_url` must be a URL or a non-empty list of URLs")
        return [(url, get_backend(config.backend, **{**config.backend_options, "base_url": url})) for url in urls]
    backend = config.create_backend()
    return [(str(urls) if urls else config.backend, backend)]


class _BuiltElsewhere(Backend):
    """The driver's stand-in for an in-process backend that each worker builds for itself.

    Always healthy here; never generates.
    """

    def __init__(self, name: str) -> None:
        self.backend_name = name

    async def health(self) -> bool:
        return True

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        raise TitoError(
            f"the {self.backend_name!r} backend runs in the worker processes; this process only routes rollouts"
        )


def _split_prompt(prompt: str | list[dict[str, Any]], system: str | None) -> tuple[str | None, Messages, str]:
    """``(system prompt, earlier messages, last user text)`` of a task's prompt."""
    if isinstance(prompt, str):
        return system, [], prompt
    history: Messages = []
    for message in prompt[:-1]:
        if message["role"] == "system":
            system = message["content"]
        else:
            history.append({"role": message["role"], "content": [{"text": message["content"]}]})
    return system, history, prompt[-1]["content"]


def _find(exc: BaseException | None, kind: type[BaseException]) -> BaseException | None:
    """The first ``kind`` in ``exc``'s cause / context chain (Strands wraps errors raised in its loop)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
