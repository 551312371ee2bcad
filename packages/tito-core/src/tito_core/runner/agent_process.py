"""Rollouts of an agent of any framework: a process or an async callable speaking OpenAI chat completions to a gateway.

The ``[rollout.agent]`` table (:class:`~tito_core.config.AgentSettings`) names the agent. Each worker process
runs one in-process gateway (``tito_core.gateway.Gateway``) per server it uses (loopback, a free port), started at
its first agent rollout; each rollout opens a gateway rollout, runs the agent against its base URL and takes the
closed trajectory back, which the worker turns into the same record a Strands rollout gets
(:mod:`tito_core.runner.finish`). With ``[rollout.gateway]`` the gateways are worker processes or Ray actors
instead (:mod:`tito_core.runner.gateway_pool`): the rollout is opened on one of them and its agent gets that
worker's endpoint; the rest is the same.

A ``command`` agent runs in a process group of its own, in the config file's directory, with ``OPENAI_BASE_URL``,
``ANTHROPIC_BASE_URL`` (the same without its ``/v1``), ``OPENAI_API_KEY`` and ``ANTHROPIC_API_KEY`` (the rollout's
token: no agent can reach a sibling's rollout) and
``TITO_TASK`` (the task as JSON) in its environment. Its standard output
and error are read as they come (a full pipe never stalls it; only their tails are kept), and the last non-empty
line of its standard output is its answer. When it exits, what it left behind in its group is killed; past the
time limit the whole group is killed and the rollout ends ``aborted``; a non-zero exit is an
:class:`AgentExited` (its exit code and its standard error's tail), which ends the rollout ``failed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec

from ..config import AgentSettings, TitoConfig
from ..errors import ConfigError, TitoError
from ..gateway import Gateway, GatewayRollout
from ..harbor.sandbox import Sandbox, base_env
from ..harbor.tasks import harbor_spec
from ..harbor.verifier import Verdict, verify
from ..status import RolloutTimedOut
from ..trajectory import Trajectory
from .dataset import Task
from .finish import Ran
from .gateway_pool import PoolGateways
from .servers import Server

__all__ = ["AgentExited", "AgentRunner", "Endpoint", "answer_line"]

STDOUT_KEPT = 1 << 20
"""Bytes of an agent's standard output kept (its tail): the answer is its last non-empty line."""
STDERR_KEPT = 2000
"""Characters of an agent's standard error a failed record quotes (its tail)."""
_LINGER_S = 10.0
"""After the agent exits and its group is killed, how long its pipes may stay open (held by a process that left the
group) before they are closed unread: a guard against a hang, never reached by an agent that keeps to its group."""

_WEEK_S = 7 * 24 * 3600.0
"""The gateway's idle timeout for agents without a time limit: the runner ends its agents, not the gateway."""

AgentFn = Callable[[Task, str, str], Awaitable[str]]  # (task, base_url, api_key: the rollout token)


class Endpoint(Protocol):
    """A rollout open on a gateway, as an agent run needs it: the in-process gateway's, or a pool worker's."""

    base_url: str
    token: str

    @property
    def lost_engine(self) -> bool:
        """A model call lost its connection to the engine (the worker has the server checked)."""

    async def guard(self, agent: Awaitable[str]) -> str:
        """Run the agent (stopped, with an error, if the gateway holding the rollout is lost)."""

    async def end(self, ended: BaseException | RolloutTimedOut | None) -> Trajectory:
        """Close the rollout as its agent ``ended`` (after the calls it left in flight) and return its trajectory."""

    async def drop(self) -> None:
        """The run was cancelled: end the rollout unrecorded where that can be done at once."""


class AgentExited(TitoError):
    """An agent process exited with a non-zero code (the rollout is ``failed``)."""

    def __init__(self, code: int, stderr_tail: str) -> None:
        self.code = code
        self.stderr_tail = stderr_tail
        how = f"exited with code {code}"
        if code < 0 and -code in signal.valid_signals():
            how = f"was killed by {signal.Signals(-code).name} (exit code {code})"
        tail = f"; stderr tail: {stderr_tail}" if stderr_tail else "; its stderr was empty"
        super().__init__(f"the agent {how}{tail}")


def answer_line(stdout: str) -> str:
    """The last non-empty line of an agent's standard output, stripped ("" when there is none)."""
    return next((line.strip() for line in reversed(stdout.splitlines()) if line.strip()), "")


class AgentRunner:
    """Runs ``[rollout.agent]`` rollouts for one worker: its gateways, and one agent run per rollout.

    Args:
        config: The run's configuration (the gateway builds each rollout's model from it).
        tokenizer: The loaded tokenizer, shared with the gateway.
        fn: The ``callable`` agent, imported (None for a ``command`` agent).
        base_dir: The config file's directory: where a ``command`` runs and its program is looked for.
        journals: With ``[rollout.gateway]``, the folder of its workers' journals (by default a new temporary one).

    Raises:
        ConfigError: No ``[rollout.agent]``; a ``callable`` that is not an ``async def``; a ``command`` whose
            program is not found.
    """

    def __init__(
        self,
        config: TitoConfig,
        tokenizer: Any,
        *,
        fn: Any = None,
        base_dir: Path | None = None,
        journals: Path | None = None,
    ) -> None:
        settings = config.rollout.agent
        if settings is None:
            raise ConfigError("the config has no `[rollout.agent]` table")
        self.config = config
        self.settings = settings
        self.tokenizer = tokenizer
        self.cwd = base_dir
        self.limit = _smaller(settings.timeout_s, config.rollout.timeout_s)
        self.fn = _agent_fn(settings, fn)
        if settings.command:
            _check_command(settings.command, base_dir)
        self._gateways: dict[str, Gateway] = {}
        self._starting = asyncio.Lock()
        self.pools: PoolGateways | None = None
        if config.rollout.gateway is not None:
            folder = journals if journals is not None else Path(tempfile.mkdtemp(prefix="tito-gateway-journal-"))
            self.pools = PoolGateways(config, config.rollout.gateway, idle_timeout=self._idle_s(), journals=folder)

    async def run(self, server: Server, task: Task, sample: int) -> tuple[Trajectory, Ran]:
        """Run the agent on ``task`` through ``server``'s gateway: the closed trajectory (with a status), the rest.

        A Harbor task (:func:`~tito_core.harbor.harbor_spec`) runs the command in a sandbox of its own, within the
        task's agent time limit too, then its verifier in the same sandbox (unless the agent failed): the
        :class:`~tito_core.harbor.Verdict` goes with the result.
        """
        started, t0 = time.time(), time.perf_counter()
        endpoint = await self._open(server, task, sample)
        text = ""
        ended_by: BaseException | RolloutTimedOut | None = None
        spec = harbor_spec(task)
        seconds = self.limit if spec is None else _smaller(self.limit, spec.agent_timeout_s)
        limit = asyncio.timeout(seconds)
        box: Sandbox | None = None
        verdict: Verdict | None = None
        try:
            try:
                if spec is not None:
                    box = await asyncio.to_thread(Sandbox.create, spec, name=f"{task.id}:{sample}", hide=spec.hide)
                async with limit:
                    text = await endpoint.guard(self._agent(task, endpoint.base_url, endpoint.token, box))
            except TimeoutError as exc:
                ended_by = RolloutTimedOut(seconds or 0.0) if limit.expired() else exc
            except Exception as exc:
                ended_by = exc
            except BaseException:  # cancelled: not recorded
                await endpoint.drop()
                raise
            agent_s = time.perf_counter() - t0
            if spec is not None:  # the verifier runs after an agent that ended well or ran out of time, as Harbor's
                if box is not None and (ended_by is None or isinstance(ended_by, RolloutTimedOut)):
                    verdict = await verify(box)
                else:
                    verdict = Verdict(reward=None, reason=f"the verifier did not run: {_why(ended_by)}")
        finally:
            if box is not None:
                await asyncio.to_thread(box.remove)
        traj = await endpoint.end(ended_by)
        calls = sum(turn.tool_calls - turn.tool_parse_errors for turn in traj.turns)
        ran = Ran(
            text=text,
            messages=[],
            server=server.name,
            started=started,
            t0=t0,
            agent_s=agent_s,
            tool_calls=calls,
            lost_engine=endpoint.lost_engine,
            verdict=verdict,
        )
        return traj, ran

    async def aclose(self) -> None:
        """Close every gateway this runner started (its worker pools too)."""
        gateways, self._gateways = list(self._gateways.values()), {}
        try:
            for gateway in gateways:
                await gateway.close()
        finally:
            if self.pools is not None:
                await self.pools.aclose()

    async def _open(self, server: Server, task: Task, sample: int) -> Endpoint:
        """Open the rollout ``task:sample`` on ``server``'s gateway: in this process, or on a pool worker."""
        rid = f"{task.id}:{sample}"
        if self.pools is not None:
            return await self.pools.open(server, rid, task.id, sample, task.index)
        gateway = await self._gateway(server)
        handle = gateway.open(task_id=task.id, metadata={"sample": sample}, rollout_id=rid, group=task.index)
        return _LocalEndpoint(gateway, handle)

    def _idle_s(self) -> float:
        """The gateway's idle timeout: the runner's limit ends an agent, not the gateway."""
        return self.limit + 60.0 if self.limit else _WEEK_S

    async def _gateway(self, server: Server) -> Gateway:
        """``server``'s gateway, started on loopback at the first rollout that needs it."""
        gateway = self._gateways.get(server.name)
        if gateway is not None:
            return gateway
        async with self._starting:
            if server.name not in self._gateways:
                gateway = Gateway(
                    self.config, tokenizer=self.tokenizer, backend=server.backend, idle_timeout=self._idle_s()
                )
                await gateway.start(host="127.0.0.1", port=0)
                self._gateways[server.name] = gateway
            return self._gateways[server.name]

    async def _agent(self, task: Task, base_url: str, token: str, box: Sandbox | None = None) -> str:
        if self.fn is not None:
            answer = await self.fn(task, base_url, token)
            if not isinstance(answer, str):
                raise TypeError(f"the agent {self.settings.callable!r} returned {type(answer).__name__}, not str")
            return answer
        assert isinstance(self.settings.command, list)
        rollout_env = {
            **self.settings.env,
            "OPENAI_BASE_URL": base_url,
            "OPENAI_API_BASE": base_url,  # LiteLLM's older name for it
            "OPENAI_API_KEY": token,
            "ANTHROPIC_API_KEY": token,
            "ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"),  # the Anthropic SDK adds /v1/messages itself
            "TITO_TASK": msgspec.json.encode(task).decode(),
        }
        if box is None:
            return await run_command(self.settings.command, env={**os.environ, **rollout_env}, cwd=self.cwd)
        env = {**base_env(), **box.spec.env, **rollout_env}  # the sandbox gets no other host variable
        command = _absolute(self.settings.command, self.cwd)
        return await run_command(box.argv(command), env=box.environ(env), cwd=None)


async def run_command(command: list[str], *, env: dict[str, str], cwd: Path | None) -> str:
    """Run ``command`` in a process group of its own; its answer line, or :class:`AgentExited`.

    Cancelled (by a time limit or the run), it kills the group before it returns.
    """
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=cwd,
        start_new_session=True,  # its own process group: one kill reaches whatever it started
    )
    assert process.stdout is not None and process.stderr is not None
    out, err = _Tail(STDOUT_KEPT), _Tail(STDERR_KEPT * 4)
    readers = [asyncio.create_task(out.drain(process.stdout)), asyncio.create_task(err.drain(process.stderr))]
    try:
        code = await process.wait()
        _kill_group(process.pid)  # what it left running would hold its pipes open
        _, lingering = await asyncio.wait(readers, timeout=_LINGER_S)
        for reader in lingering:
            reader.cancel()
    finally:
        _kill_group(process.pid)
        for reader in readers:
            reader.cancel()
        with contextlib.suppress(ProcessLookupError):
            await asyncio.shield(process.wait())
    if code != 0:
        raise AgentExited(code, _tail(err.text().strip(), STDERR_KEPT))
    return answer_line(out.text())


class _Tail:
    """Reads a pipe to its end, keeping only its last ``keep`` bytes."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.buffer = bytearray()

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(1 << 16):
            self.buffer += chunk
            if len(self.buffer) > 2 * self.keep:
                del self.buffer[: -self.keep]

    def text(self) -> str:
        return bytes(self.buffer[-self.keep :]).decode("utf-8", errors="replace")


def _tail(text: str, size: int) -> str:
    """The last ``size`` characters of ``text``, from a line's start where it is cut ("..." marks the cut)."""
    if len(text) <= size:
        return text
    text = text[-size:]
    return "..." + text[text.find("\n") + 1 :]


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class _LocalEndpoint:
    """A rollout of the runner's in-process gateway."""

    def __init__(self, gateway: Gateway, handle: GatewayRollout) -> None:
        self.gateway = gateway
        self.handle = handle
        self.base_url = handle.base_url
        self.token = handle.token

    @property
    def lost_engine(self) -> bool:
        return self.handle.lost_engine

    async def guard(self, agent: Awaitable[str]) -> str:
        return await agent

    async def end(self, ended: BaseException | RolloutTimedOut | None) -> Trajectory:
        """Take the rollout's trajectory from the gateway, closed with the status of how its agent ended.

        A call the agent left in flight (it was killed mid-call) ends first and is recorded as the engine answered
        it. Then how the agent ended replaces the status its calls left where :func:`~tito_core.status.replaces`
        says so. An agent that ended well leaves the closing to the gateway (aborted when tool calls were left
        unanswered).
        """
        await self.gateway.get(self.handle.id).idle()
        return await self.gateway.take(self.handle.id, ended)

    async def drop(self) -> None:
        """An idle rollout is closed now, a busy one when the gateway closes."""
        with contextlib.suppress(Exception):
            if not self.gateway.get(self.handle.id).busy:
                await self.gateway.take(self.handle.id)


def _why(ended: BaseException | RolloutTimedOut | None) -> str:
    """How an agent ended, in a few words, for the reason a verifier did not run."""
    if isinstance(ended, AgentExited):
        return f"the agent exited with code {ended.code}"
    return f"{type(ended).__name__}: {ended}" if ended is not None else "the sandbox was not made"


def _absolute(command: list[str], base_dir: Path | None) -> list[str]:
    """``command`` with every argument that names a file of the config's directory made absolute.

    In a sandbox the command runs in the task's working directory.
    """
    base = base_dir or Path.cwd()
    return [str(base / part) if not os.path.isabs(part) and (base / part).is_file() else part for part in command]


def _smaller(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _agent_fn(settings: AgentSettings, fn: Any) -> AgentFn | None:
    if settings.callable is None:
        return None
    shape = "an `async def agent(task, base_url, api_key) -> str` (api_key: the rollout's token)"
    if not inspect.iscoroutinefunction(fn):
        raise ConfigError(f"`rollout.agent.callable` {settings.callable!r} must be {shape}")
    try:
        inspect.signature(fn).bind(None, "", "")
    except TypeError:
        raise ConfigError(
            f"`rollout.agent.callable` {settings.callable!r} must be {shape}: it cannot take three arguments (a "
            "two-argument agent has no token to reach its rollout with)"
        ) from None
    agent: AgentFn = fn
    return agent


def _check_command(command: list[str] | str, base_dir: Path | None) -> None:
    """The program of ``command`` exists, so that a typo fails before any rollout instead of failing every one."""
    program = command[0] if isinstance(command, list) else command
    if os.sep in program:
        path = Path(program) if Path(program).is_absolute() else (base_dir or Path.cwd()) / program
        found = path.is_file() and os.access(path, os.X_OK)
    else:
        found = shutil.which(program) is not None
    if not found:
        raise ConfigError(f"`rollout.agent.command`: the program {program!r} is not found (or not executable)")
