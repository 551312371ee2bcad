"""The fault-suite harness: a fault server per test, one backend per adapter, rollouts and their invariants.

Every scenario ends with :meth:`Harness.check`, the promises that hold whatever the fault:

* every branch of the rollout has a status, never ``running`` once the agent call has returned or raised,
  and a reason when it did not complete;
* every recorded turn's output ids and logprobs are exactly what the server sent for that turn's request
  id, and the request the server received for that rid is exactly the trajectory before the output;
* every output segment belongs to a recorded turn (nothing recorded that the engine did not produce);
* the server generated no request id twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from strands import Agent, tool
from strands.agent.conversation_manager import ConversationManager

from tests.helpers import add, agent_for
from tito_core import TitoModel, Trajectory, get_backend
from tito_core.backend import Backend
from tito_core.http import RetryPolicy

from .server import FaultServer, Received

SYSTEM = "You count with the add tool."
PROMPT = "Count to the end with the add tool."
TERMINAL = ("completed", "truncated", "aborted", "failed")
ADAPTERS = ("sglang", "vllm")

# Fast, bounded retries: 3 attempts, at most 0.5 s apart, 5 s in all.
RETRY = RetryPolicy(max_attempts=3, initial_delay=0.02, max_delay=0.5, max_total=5.0, jitter=0.5)


@tool(name="add")
async def slow_add(a: int, b: int) -> int:
    """Add two integers, slowly."""
    await asyncio.sleep(0.3)
    return a + b


def add_after_pause(server: FaultServer, times: int = 1) -> Any:
    """An ``add`` tool that returns once ``server`` has been paused ``times`` times: the rollout's next call meets
    the paused engine, however slow the machine."""

    @tool(name="add")
    async def add_after(a: int, b: int) -> int:
        """Add two integers."""
        await server.paused(times)
        return a + b

    return add_after


def first_gens(n: int) -> Callable[[Received], bool]:
    """A predicate matching the first ``n`` generation requests (``FaultServer.decode_until_cut``)."""
    return lambda r: r.gen is not None and r.gen < n


@dataclass
class StallTimeout:
    """``backend``'s timeout is ``seconds`` for one stalled request alone, so that the calls which must succeed never
    run under it, however slow the machine: :meth:`after_call` (a Strands ``AfterModelCallEvent`` callback) sets it
    once the first model call was answered; :meth:`restore` (the fault rule's ``then``) gives the backend its own
    back the moment the server has read the stalled request (a timeout is taken when a request is sent)."""

    backend: Any
    seconds: float
    kept: float | None = None
    armed: bool = False

    def after_call(self, event: Any) -> None:
        if not self.armed and event.exception is None:
            self.armed = True
            self.kept, self.backend.http.timeout = self.backend.http.timeout, self.seconds

    def restore(self, received: Received) -> None:
        self.backend.http.timeout = self.kept


def find_error(exc: BaseException | None, kind: type[BaseException]) -> BaseException | None:
    """The first ``kind`` in ``exc``'s cause / context chain (Strands wraps model errors)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, kind):
            return exc
        inner = getattr(exc, "original_exception", None)
        if isinstance(inner, BaseException) and isinstance(inner, kind):
            return inner
        exc = exc.__cause__ or exc.__context__
    return None


def all_branches(traj: Trajectory) -> list[Trajectory]:
    """Earlier branches first, the live one last."""
    return [*traj.branches, traj]


@dataclass
class Outcome:
    """One agent invocation: what it returned or raised, and the model that recorded it."""

    model: TitoModel
    agent: Agent
    error: BaseException | None
    result: Any
    elapsed: float

    @property
    def traj(self) -> Trajectory:
        return self.model.trajectory

    def raised(self, kind: type[BaseException]) -> BaseException:
        """The ``kind`` error the invocation raised (fails the test when it raised something else)."""
        found = find_error(self.error, kind)
        assert found is not None, f"expected {kind.__name__}, the call raised {self.error!r}"
        return found


@dataclass
class Harness:
    """A fault server, the adapter under test, and the rollouts run against them."""

    server: FaultServer
    tokenizer: Any
    adapter: str
    backends: list[Backend] = field(default_factory=list)

    def backend(self, url: str | None = None, **options: Any) -> Backend:
        """A backend of the adapter under test (vLLM: the native generate endpoint) at the fault server."""
        options.setdefault("timeout", 5.0)
        options.setdefault("retry", RETRY)
        if self.adapter == "vllm":
            options.setdefault("endpoint", "generate")
        backend = get_backend(self.adapter, base_url=url or self.server.url, **options)
        self.backends.append(backend)
        return backend

    def model(self, backend: Backend | None = None, **kwargs: Any) -> TitoModel:
        kwargs.setdefault("sampling", {"max_new_tokens": 64})
        return TitoModel(backend or self.backend(), self.tokenizer, tool_parser="hermes", **kwargs)

    async def rollout(
        self,
        *,
        model: TitoModel | None = None,
        backend: Backend | None = None,
        tools: Sequence[Any] = (add,),
        manager: ConversationManager | None = None,
        callbacks: Sequence[tuple[type[Any], Callable[[Any], Any]]] = (),
        prompt: str = PROMPT,
        agent: Agent | None = None,
        limit: float = 30.0,
        **model_kwargs: Any,
    ) -> Outcome:
        """Run one agent invocation (bounded in time); never raises what the agent raised."""
        model = model or (agent.model if agent is not None else self.model(backend, **model_kwargs))  # type: ignore[assignment]
        if agent is None:
            agent = agent_for(model, tools, system_prompt=SYSTEM, manager=manager)
            for event, callback in callbacks:
                agent.hooks.add_callback(event, callback)
        started = time.monotonic()
        error: BaseException | None = None
        result = None
        try:
            async with asyncio.timeout(limit):
                result = await agent.invoke_async(prompt)
        except Exception as exc:
            error = exc
        assert isinstance(model, TitoModel)
        return Outcome(model, agent, error, result, time.monotonic() - started)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 3.0) -> bool:
        """Poll ``predicate`` every 10 ms until it holds. Every caller asserts that it comes true, so the
        deadline only ends a hang: it is never under 60 s (``timeout`` is the caller's expectation, not a
        limit a busy machine could miss)."""
        deadline = time.monotonic() + max(timeout, 60.0)
        while time.monotonic() < deadline:
            if predicate():
                return True
            await asyncio.sleep(0.01)
        return predicate()

    # -- invariants -------------------------------------------------------------------------------

    def check(self, outcome: Outcome | TitoModel) -> None:
        """The promises that hold whatever the fault (see the module docstring)."""
        model = outcome.model if isinstance(outcome, Outcome) else outcome
        check_trajectory(self.server, model.trajectory)
        assert self.server.duplicates() == [], f"request ids generated twice: {self.server.duplicates()}"
        assert self.server.bad_parents() == [], f"sessions continued from failed requests: {self.server.bad_parents()}"


def check_trajectory(server: FaultServer, traj: Trajectory) -> None:
    """Status set on every branch (an open lineage other than the last call's may be running); every recorded output
    is exactly the server's answer for its rid."""
    forged = [ids for ids in server.forged]
    for branch in all_branches(traj):
        where = f"branch {branch.branch}"
        left = branch is not traj and not branch.closed  # a lineage the last call left open may still go on
        assert branch.status in TERMINAL or (left and branch.status == "running"), (
            f"{where}: status {branch.status!r} after the call returned"
        )
        if branch.status not in ("completed", "running"):
            assert branch.status_reason, f"{where}: status {branch.status!r} without a reason"
        ids, lps = branch.token_ids, branch.logprobs
        spans = set()
        for turn in branch.turns:
            start, end = turn.output_start, turn.output_start + turn.output_len
            at = start  # a partial rollout: the request's answer, then each continuation's, from where it stopped
            for rid in (turn.rid, *turn.continued_rids):
                answers = [a for a in server.answers.get(rid, [])]
                assert len(answers) == 1, f"{where}: turn {turn.index} rid {rid} answered {len(answers)} times"
                answer = answers[0]
                n = len(answer.output_ids)
                assert ids[at : at + n] == answer.output_ids, f"{where}: turn {turn.index} output is not the server's"
                assert lps[at : at + n] == answer.logprobs, f"{where}: turn {turn.index} logprobs are not the server's"
                sent = [r for r in server.received if r.rid == rid and r.generated]
                assert len(sent) == 1 and sent[0].input_ids == ids[:at], (
                    f"{where}: turn {turn.index}: the engine consumed another prompt than the one recorded"
                )
                at += n
            assert at == end, f"{where}: turn {turn.index} holds {end - at} tokens no answer sent"
            assert ids[start:end] not in forged
            spans.add((start, end))
        for segment in branch.segments:
            if segment.kind == "output":
                assert (segment.start, segment.end) in spans, (
                    f"{where}: output segment {segment.start}:{segment.end} belongs to no recorded turn"
                )


@pytest.fixture(params=ADAPTERS)
def adapter(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def server(qwen3_tokenizer: Any) -> AsyncIterator[FaultServer]:
    srv = await FaultServer(qwen3_tokenizer, sessions=True).start()  # the SGLang adapter uses them (auto)
    try:
        yield srv
    finally:
        await srv.aclose()


@pytest.fixture
async def h(server: FaultServer, qwen3_tokenizer: Any, adapter: str) -> AsyncIterator[Harness]:
    harness = Harness(server, qwen3_tokenizer, adapter)
    try:
        yield harness
    finally:
        for backend in harness.backends:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(backend.aclose(), 5.0)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from . import figures

    lines = figures.summary_lines()
    if lines:
        terminalreporter.section("fault suite figures")
        for line in lines:
            terminalreporter.write_line(line)
