"""The ``[rollout]`` table of a config: how the rollout runner (``tito rollout``) runs agents, and an agent process.

:class:`~tito_core.config.TitoConfig` holds a :class:`RolloutSettings` as its ``rollout`` field; both are
importable from :mod:`tito_core.config` too.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from tito_core.errors import ConfigError

__all__ = ["CONVERSATION_MANAGERS", "AgentSettings", "GatewaySettings", "RolloutSettings", "TaskSource"]


CONVERSATION_MANAGERS = ("null", "sliding_window", "summarizing")
"""The built-in names of ``rollout.conversation_manager`` (Strands' managers)."""


class AgentSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An agent of any framework that the runner drives through its gateway (the ``[rollout.agent]`` table).

    Exactly one of ``command`` and ``callable``. Each rollout gets its own gateway rollout
    (:mod:`tito_core.runner.agent_process`, docs/rollouts.md).

    Attributes:
        command: The program and its arguments, started once per rollout in the config file's directory with
            ``OPENAI_BASE_URL`` (the rollout's base URL), ``OPENAI_API_KEY`` (the rollout id) and ``TITO_TASK``
            (the task as JSON) set; the last non-empty line of its standard output is its answer.
        callable: Import path of ``async def agent(task, base_url) -> str`` (the answer), run on the runner's loop.
        timeout_s: Wall-clock limit of one agent run; past it the process group is killed and the rollout ends
            ``aborted``. ``rollout.timeout_s`` applies too: the smaller one wins.
        env: Variables added to the command's environment (the runner's own environment is inherited).
    """

    command: list[str] | str | None = None  # a string only to name the mistake (no shell splits it)
    callable: str | None = None
    timeout_s: float | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.command is None) == (self.callable is None):
            raise ConfigError("`rollout.agent` needs exactly one of `command` (a list of strings) and `callable`")
        if isinstance(self.command, str):
            raise ConfigError(
                f'`rollout.agent.command` must be a list of strings, e.g. ["python", "agent.py"], not the string '
                f"{self.command!r} (no shell splits it)"
            )
        if self.command is not None and (not self.command or not all(part.strip() for part in self.command)):
            raise ConfigError(
                f"`rollout.agent.command` must be a non-empty list of non-empty strings: {self.command!r}"
            )
        if self.callable is not None and ":" not in self.callable:
            raise ConfigError(
                f"`rollout.agent.callable` must be an import path 'module:attribute', not {self.callable!r}"
            )
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ConfigError(f"`rollout.agent.timeout_s` must be positive, got {self.timeout_s}")
        if self.env and self.command is None:
            raise ConfigError("`rollout.agent.env` is for a `command` agent; a `callable` runs in this process")


class TaskSource(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where the tasks come from when no dataset file is given (the ``[rollout.tasks]`` table).

    Attributes:
        harbor: A Harbor dataset: a folder of task folders, or one task folder (``instruction.md``, ``task.toml``,
            ``environment/``, ``tests/test.sh``), relative to the config file's directory. Each task runs the
            ``[rollout.agent]`` command in a sandbox of its own and is rewarded by its verifier
            (:mod:`tito_core.harbor`, docs/harbor.md). Needs the ``harbor`` package (Python 3.12+).
    """

    harbor: str | None = None

    def __post_init__(self) -> None:
        if not self.harbor:
            raise ConfigError("`rollout.tasks` needs `harbor` (the path of a Harbor task folder or dataset)")


class GatewaySettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where the ``[rollout.agent]`` rollouts' gateway runs: a pool of gateway worker processes (``[rollout.gateway]``).

    Without this table each runner process serves its agents from one in-process gateway per server. With it, the
    runner starts a :class:`~tito_core.gateway.workers.WorkerPool` per server (the processes of ``tito serve
    --workers``; Ray actors with ``ray``), opens each rollout on one worker and gives its agent that worker's
    endpoint (:mod:`tito_core.runner.gateway_pool`, docs/scaling.md).

    Attributes:
        workers: Gateway worker processes (per server the run uses), at least 1.
        ray: The Ray cluster to start the workers on as actors (``"auto"``: the one this machine runs, or an
            address ``HOST:PORT``); None starts them as local processes.
        num_cpus: The CPUs Ray reserves for each worker actor (only with ``ray``).
    """

    workers: int
    ray: str | None = None
    num_cpus: float | None = None

    def __post_init__(self) -> None:
        workers = self.workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"`rollout.gateway.workers` must be an integer of at least 1, got {workers!r}")
        if self.ray is not None and not self.ray.strip():
            raise ConfigError('`rollout.gateway.ray` must be a Ray address ("auto" or HOST:PORT), not an empty string')
        if self.num_cpus is not None and self.ray is None:
            raise ConfigError("`rollout.gateway.num_cpus` is the CPUs Ray reserves per worker actor: it needs `ray`")
        if self.num_cpus is not None and not self.num_cpus > 0:
            raise ConfigError(f"`rollout.gateway.num_cpus` must be positive, got {self.num_cpus}")


_STRANDS_ONLY = ("tools", "forced_tool_calls", "system_prompt", "max_model_calls", "max_tool_calls", "max_messages")
"""``[rollout]`` keys a Strands agent uses and an ``[agent]`` (which brings its own loop and tools) cannot."""


class RolloutSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the rollout runner turns a dataset of tasks into rollouts (the ``[rollout]`` table).

    Callables are given by import path, ``"module:attribute"`` (the config file's directory is importable).

    Attributes:
        group_size: Rollouts per task (a GRPO group).
        concurrency: Most rollouts running at once.
        system_prompt: The agent's system prompt.
        tools: Import paths of Strands tools (``@tool`` functions), or of modules of them.
        reward: Import path of ``reward(sample) -> float`` (sync or async), given a
            :class:`tito_core.runner.Sample`; None leaves rewards empty.
        group_reward: Import path of ``group_reward(rewards) -> advantages`` (sync or async), called once per
            finished group with its rewards (None where a rollout has none); e.g.
            ``"tito_core.runner.rewards:group_normalized"``.
        prepare: Import path of a callable run once before any work; it returns a mapping of config keys
            to override (e.g. the path of a model it builds), or None.
        timeout_s: Wall-clock limit of one rollout; past it the rollout ends ``aborted``.
        max_model_calls: Model calls allowed per rollout; one more ends it ``truncated``.
        max_tool_calls: Tool calls allowed per rollout; one more ends it ``truncated``.
        max_messages: Messages allowed in the conversation before a model call; more end it ``truncated``.
        forced_tool_calls: The first this many model calls of each rollout must call a tool
            (``tool_choice="any"``, by the engine's constrained decoding); later calls use ``tool_choice``. For
            small models that rarely call tools on their own. Needs ``tools`` and a backend with grammars.
        health_interval_s: Seconds between health checks of each server.
        row_group_size: Records per Parquet row group (flushed to disk as each fills).
        retry_failed: On resume, remove the output's ``failed`` records of the dataset's tasks (with a
            ``group_reward``, every record of a group that has one) and run them again. ``aborted`` records
            are kept. Off by default: it rewrites the output, which a run otherwise never does.
        conversation_manager: How the agent's history is managed: ``"null"`` (the default: never rewritten),
            ``"sliding_window"``, ``"summarizing"`` (Strands' managers; the summary is generated by the rollout's
            own model, so it is recorded as model output), or the import path of a callable returning a Strands
            ``ConversationManager``. Each rewrite forks the rollout into a new branch (docs/rollouts.md).
        conversation_manager_options: Keyword arguments for it (e.g. ``window_size``, ``summary_ratio``,
            ``preserve_recent_messages``).
        context_manager: Strands' ``Agent(context_manager=...)``: ``"auto"``, ``"agentic"`` or a strategy config
            table; it replaces ``conversation_manager``.
        branch_reward: How a rollout with several branches becomes training samples where tito makes them
            (``RolloutBatches(samples=...)``): ``"shared"`` or ``"last"`` (:data:`tito_core.export.BranchReward`).
        current_version: The trainer's current weight version (an int, or a version string as the engines report
            it); each record's ``staleness`` is counted from it when the record is written (docs/async.md).
        max_staleness: Versions a rollout's oldest generated token may be behind ``current_version``; more makes
            it stale (:mod:`tito_core.runner.staleness`). None (the default) turns the check off. Needs
            ``current_version``.
        stale: What happens to a stale rollout: ``"mark"`` (the default) writes it with ``stale = true`` for the
            trainer to filter; ``"drop"`` does not write it (it is counted in the summary, and a rerun on the
            same output runs it again, under the weights current then).
        gc: Python's garbage collector while rollouts run: ``"tuned"`` (the default) moves what is alive when
            they start out of its reach and collects the young generation every 10,000 allocations instead of
            700, restoring the settings after (~14 % more rollouts/s at 512 at once, docs/scaling.md);
            ``"default"`` leaves the process's settings alone (:mod:`tito_core.runner.collector`).
        agent: An agent of any framework, run per rollout against tito's gateway instead of a Strands agent
            (:class:`AgentSettings`); it brings its own tools and loop, so the Strands-only keys stay unset.
        tasks: Where the tasks come from when the run is given no dataset (:class:`TaskSource`: a Harbor dataset).
        gateway: Run the ``[rollout.agent]`` rollouts' gateway in worker processes or Ray actors
            (:class:`GatewaySettings`); None serves them from the runner's own process.
    """

    group_size: int = 1
    concurrency: int = 32
    system_prompt: str | None = None
    tools: list[str] = msgspec.field(default_factory=list)
    reward: str | None = None
    group_reward: str | None = None
    prepare: str | None = None
    timeout_s: float | None = None
    max_model_calls: int | None = None
    max_tool_calls: int | None = None
    max_messages: int | None = None
    forced_tool_calls: int = 0
    health_interval_s: float = 10.0
    row_group_size: int = 256
    retry_failed: bool = False
    conversation_manager: str = "null"
    conversation_manager_options: dict[str, Any] = msgspec.field(default_factory=dict)
    context_manager: str | dict[str, Any] | None = None
    branch_reward: Literal["shared", "last"] = "shared"
    current_version: str | int | None = None
    max_staleness: int | None = None
    stale: Literal["drop", "mark"] = "mark"
    gc: Literal["tuned", "default"] = "tuned"
    agent: AgentSettings | None = None
    tasks: TaskSource | None = None
    gateway: GatewaySettings | None = None

    def __post_init__(self) -> None:
        if self.agent is not None:
            self._check_agent()
        if self.tasks is not None and (self.agent is None or self.agent.command is None):
            raise ConfigError(
                "`rollout.tasks.harbor` runs a harness in a sandbox: it needs `[rollout.agent]` with a `command`"
            )
        if self.gateway is not None and self.agent is None:
            raise ConfigError(
                "`rollout.gateway` runs the gateway of `[rollout.agent]` rollouts: it needs `[rollout.agent]` (a "
                "Strands rollout calls its engine from the runner, through no gateway)"
            )
        if self.tasks is not None and self.reward is not None:
            raise ConfigError("`rollout.reward` with `rollout.tasks.harbor`: each task's verifier is the reward")
        for name in ("group_size", "concurrency", "row_group_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"`rollout.{name}` must be at least 1, got {getattr(self, name)}")
        for name in ("timeout_s", "health_interval_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"`rollout.{name}` must be positive, got {value}")
        if self.forced_tool_calls < 0:
            raise ConfigError(f"`rollout.forced_tool_calls` must be >= 0, got {self.forced_tool_calls}")
        if self.forced_tool_calls and not self.tools:
            raise ConfigError("`rollout.forced_tool_calls` needs `rollout.tools`: there is no tool to call")
        builtin = self.conversation_manager in CONVERSATION_MANAGERS
        if not builtin and ":" not in self.conversation_manager:
            raise ConfigError(
                f"`rollout.conversation_manager` must be one of {list(CONVERSATION_MANAGERS)} or an import path "
                f"'module:attribute', not {self.conversation_manager!r}"
            )
        for name in ("max_model_calls", "max_tool_calls", "max_messages"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"`rollout.{name}` must be >= 0, got {value}")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ConfigError(f"`rollout.max_staleness` must be >= 0, got {self.max_staleness}")
        if self.current_version == "":
            raise ConfigError("`rollout.current_version` must be a version (an int or a non-empty string), not ''")
        if self.max_staleness is not None and self.current_version is None:
            raise ConfigError(
                "`rollout.max_staleness` needs `rollout.current_version`: staleness is counted from the trainer's "
                "current weight version"
            )

    def _check_agent(self) -> None:
        defaults = RolloutSettings()
        used = [name for name in _STRANDS_ONLY if getattr(self, name) != getattr(defaults, name)]
        if self.conversation_manager != "null" or self.conversation_manager_options:
            used.append("conversation_manager")
        if self.context_manager is not None:
            used.append("context_manager")
        if used:
            raise ConfigError(
                f"`rollout.{used[0]}` is for Strands rollouts: an `[rollout.agent]` brings its own loop, tools and "
                f"prompts (remove {', '.join(f'`rollout.{name}`' for name in used)})"
            )
