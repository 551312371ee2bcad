"""The gateway's Python API: :class:`Gateway` opens rollouts, answers calls on them, and ends and writes them.

One :class:`~tito_core.rollout_core.call.Rollout` per gateway rollout, built from the config's
:class:`~tito_core.model_setup.ModelSetup`, the setup :meth:`TitoConfig.create_model` builds a
:class:`~tito_core.strands_front.model.TitoModel` from (the same renderer, tool parser, vision, sampling and
options): the gateway is a second front on the core, with nothing Strands-specific. A call goes through one of the
gateway's fronts (:mod:`~tito_core.gateway.fronts`, registered as plugins): the front decodes its request into the
neutral call (:mod:`~tito_core.gateway.call`), the rollout records it, and the front encodes the answer; the rollout
remembers what it returned so the replayed message reaches the core as the exact reply. Ending a rollout
(``finish``, ``take``, the idle timeout, ``close``) closes its trajectory with a status and, with an output, writes
it with the runner's writer.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..backend import Backend
from ..config import TitoConfig
from ..errors import ConfigError
from ..media.processor import ProcessorSpec, VisionProcessor, refusal
from ..model_setup import ModelSetup
from ..records import RolloutRecord
from ..rollout_core.labels import Label
from ..rollout_core.tree import close_reason
from ..status import Closed, NoModelCall, Outcome, Stopped, replaces, status_of
from ..tokenizers import aload_tokenizer
from ..trajectory import Trajectory
from .access import Access, is_loopback
from .call import answer_call, count_prompt
from .errors import GatewayError
from .fronts import Context, Decoded, Front, Route, load_fronts
from .images import ImageReader
from .journal import Journal
from .output import GatewayOutput
from .registry import GatewayRollout, Registry

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["Gateway", "GatewayRollout"]

logger = logging.getLogger("tito")
SEND_GRACE_S = 1.0
"""At shutdown, after the drain: how long requests still open get to end (an answer being sent) before they are cut.

A request then is no call (the calls were drained): an answer on its way, or a body still arriving, which
would be refused anyway. aiohttp's default (60 s) let one stalled upload hold the exit for a minute."""
LISTEN_BACKLOG = 4096
"""Connections the kernel queues for the gateway (and for the door of ``tito serve --workers``) until it accepts them.

A batch of agents connects at once. aiohttp's default, 128, overflowed with 512 rollouts in flight on two Ray
actors: the kernel dropped handshakes, and clients saw connections reset under their calls. Linux caps it at
``net.core.somaxconn`` (4096 by default)."""


class Gateway:
    """An OpenAI-compatible gateway recording one trajectory per rollout.

    Args:
        config: The model configuration (backend, tokenizer, tool parser, sampling, template, options).
        tokenizer: A loaded tokenizer; None loads ``config.tokenizer`` (on a thread, in :meth:`start`).
        backend: The backend to share between rollouts, the caller's: :meth:`close` leaves it open. None builds
            the configured one, which is the gateway's own: :meth:`close` closes it.
        output: A rollout file (JSONL, or ``.parquet``) every ended rollout is written to, with the runner's
            writer (its lock, resumable); None writes nothing (use :meth:`take`).
        api_key: The key every request must carry (``Authorization: Bearer KEY``); required to bind to anything
            but loopback.
        idle_timeout: Seconds without a call after which a rollout is ended (``aborted`` unless it ended
            otherwise) and written.
        max_body_bytes: The largest request body accepted (413 above it).
        processor: The image processor of a vision model, as ``TitoModel(processor=...)`` takes it (a directory,
            a Hugging Face image processor, a :class:`~tito_core.media.processor.VisionProcessor`); None takes the
            config's ``processor`` (by default the tokenizer's directory when it holds a
            ``preprocessor_config.json``); False: a text-only model, every image part a 400.
        allow_hosts: More ``Host`` header values to serve (a name, or ``name:port``), besides the bound address
            (and, on loopback, ``localhost``, ``127.0.0.1`` and ``[::1]``): a foreign Host is a 403 (DNS rebinding).
        allow_origins: Browser origins allowed to call (``https://app.example``); any other ``Origin`` is a 403.
            None by default: no web page can call the gateway, and it sends no CORS headers.
        fronts: The names of the fronts to serve (the registered ones, :mod:`~tito_core.gateway.fronts`), None for
            all of them.
    """

    def __init__(
        self,
        config: TitoConfig,
        *,
        tokenizer: Any = None,
        backend: Backend | None = None,
        output: str | Path | None = None,
        api_key: str | None = None,
        idle_timeout: float = 600.0,
        max_body_bytes: int = 32 << 20,
        processor: ProcessorSpec = None,
        allow_hosts: Sequence[str] = (),
        allow_origins: Sequence[str] = (),
        fronts: Sequence[str] | None = None,
    ) -> None:
        _check_settings(api_key, idle_timeout, max_body_bytes)
        self.config = config
        self.tokenizer = tokenizer
        self.backend = backend if backend is not None else config.create_backend()
        self._owns_backend = backend is None  # who creates a backend closes it
        self.output_path = output
        self.max_body_bytes = max_body_bytes
        self.model_name = served_model_name(config)
        self.base_url = ""
        self.registry = Registry(idle_timeout, self._end_idle)
        self.setup: ModelSetup | None = None  # built once the tokenizer is loaded (prepare)
        self._processor = processor
        self._image_refusal: str | None = None
        self.writer = GatewayOutput(output)
        self._runner: web.AppRunner | None = None
        self._closing = False
        self._hurry = asyncio.Event()
        self.access = Access(api_key, allow_hosts, allow_origins)
        self.fronts: Sequence[Front] = tuple(load_fronts(fronts))
        self.journal: Journal | None = None  # a worker's write-ahead journal (gateway/workers.py)

    # ------------------------------------------------------------------------------------------- lifecycle
    async def prepare(self) -> None:
        """Load the tokenizer, build the :class:`~tito_core.model_setup.ModelSetup`, open the output (once)."""
        if self.setup is not None:
            return
        tokenizer = self.config.tokenizer_or(self.tokenizer)
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = await aload_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.setup = await asyncio.to_thread(self.config.model_setup, tokenizer, processor=self._processor)
        self._image_refusal = image_refusal(self.setup.vision, self.backend)
        self.writer.open()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port`` (0: a free port) and return the base URL, ``http://HOST:PORT``.

        Raises:
            ConfigError: ``host`` is not loopback and no ``api_key`` was given.
        """
        from aiohttp import web

        from .app import build_app

        if not is_loopback(host) and self.access.api_key is None:
            raise ConfigError(f"binding the gateway to {host!r} (not loopback) requires an api key (--api-key)")
        if self._runner is not None:
            raise ConfigError("the gateway is already started")
        await self.prepare()
        runner = web.AppRunner(build_app(self), access_log=None, handle_signals=False, shutdown_timeout=SEND_GRACE_S)
        await runner.setup()
        site = web.TCPSite(runner, host, port, backlog=LISTEN_BACKLOG)
        await site.start()
        self._runner = runner
        bound = runner.addresses[0]
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.base_url = f"http://{shown}:{bound[1]}"
        self.access.bind(host, shown, int(bound[1]))
        self.registry.start()
        logger.info("tito gateway serving on %s", self.base_url)
        return self.base_url

    @property
    def closing(self) -> bool:
        """True once :meth:`close` began: no new rollout or call is taken (503, ``x-should-retry: false``)."""
        return self._closing

    def stop_draining(self) -> None:
        """End :meth:`close`'s wait for the calls in flight now (a second Ctrl-C): they are cancelled."""
        self._hurry.set()

    async def close(self, drain_s: float = 30.0) -> None:
        """Stop serving without losing an answer; every open rollout is written.

        In order: new rollouts and calls are refused (503, ``x-should-retry: false``); the calls in flight get up
        to ``drain_s`` seconds to finish (:meth:`stop_draining` ends the wait), each recorded before it is
        answered; a call still running then is cancelled (aborted on the engine, recorded as a cancelled call, its
        client answered 503, never 200); then every open rollout ends ``aborted`` (unless it ended otherwise) and
        is written, and the output closed (a Parquet file's last part). Requests still open then (an answer being
        sent, a body still arriving) get :data:`SEND_GRACE_S` to end before their connections are closed. No answer
        is sent whose output ids are not in a written record. The backend is closed when the gateway built it (no
        ``backend`` was given); a given one is left open.
        """
        self._closing = True
        await self.registry.stop()
        await self.registry.finish_calls(drain_s, self._hurry)
        runner, self._runner = self._runner, None
        for rollout in self.registry.drain():
            traj = self._end(rollout, "shutdown", Stopped("the gateway shut down before the rollout was finished"))
            self.writer.write_ended(rollout, traj, self.base_url)
        self.writer.close()  # every record is written: nothing below waits on a client
        if runner is not None:
            await runner.cleanup()
        if self._owns_backend:
            await self.backend.aclose()

    # -------------------------------------------------------------------------------------------- rollouts
    def open(
        self,
        task_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        rollout_id: str | None = None,
        group: int = 0,
    ) -> GatewayRollout:
        """Open a rollout; its :attr:`GatewayRollout.base_url` is what an OpenAI client sets.

        ``group`` is the record's group id (the runner gives the task's row index, so that group advantages mean
        the same for every kind of rollout). Any id is taken: its URL path segment is percent-quoted.

        Raises:
            GatewayError: 409 when ``rollout_id`` is open already; 400 for the ids ``.`` and ``..`` (a URL
                would drop them as dot segments).
            ConfigError: The gateway was not prepared (:meth:`start` or :meth:`prepare`).
        """
        if self.setup is None:
            raise ConfigError("the gateway is not prepared: await start() (or prepare()) first")
        _refuse_if_closing(self._closing)
        rid = _new_id(self.registry, rollout_id)
        core = self.setup.rollout(self.backend, rid)
        task = task_id if task_id is not None else rid
        url = f"{self.base_url}/rollouts/{quote(rid, safe=':@')}/v1"  # the routes match the id back unquoted
        rollout = GatewayRollout(rid, url, core, task, dict(metadata or {}))
        rollout.group, rollout.options = group, self.setup.options
        rollout.images.refusal = self._image_refusal
        self.registry.add(rollout)
        self.access.add(rid, rollout.token)
        core.trajectory.metadata.update({**rollout.metadata, "task_id": task})
        rollout.sample = self.writer.next_sample(task, rid)
        if self.journal is not None:
            _journaled(self.journal.opened, rollout, self.base_url, what="the rollout was opened")
        return rollout

    def authorize(self, rollout_id: str, credential: str | None) -> None:
        """Check a request on rollout ``rollout_id``: 404 when unknown, 401 without its token or the key."""
        if self.registry.finished(rollout_id) is None:
            self.registry.get(rollout_id)
        self.access.authorize(rollout_id, credential)

    def get(self, rollout_id: str) -> GatewayRollout:
        """The open rollout ``rollout_id`` (404, or 409 when it was finished)."""
        if self.registry.finished(rollout_id) is not None:
            message = f"rollout {rollout_id!r} is finished and takes no more calls"
            raise GatewayError(409, message, code="rollout_finished")
        return self.registry.get(rollout_id)

    def trajectory_json(self, rollout_id: str) -> bytes:
        """The trajectory JSON of an open rollout or a recently finished one (404 otherwise)."""
        done = self.registry.finished(rollout_id)
        return done if done is not None else self.registry.get(rollout_id).core.trajectory.to_json()

    async def take(self, rollout_id: str, ended: Outcome | None = None) -> Trajectory:
        """Close rollout ``rollout_id`` (a status set), remove it, and return its trajectory; later calls get 409.

        ``ended`` is how the rollout's agent ended when its caller knows (a time limit, an exception): it decides
        the status where :func:`~tito_core.status.replaces` says so.
        """
        self.get(rollout_id)
        rollout = self.registry.remove(rollout_id)
        return self._end(rollout, "finish", ended)

    def reward(self, rollout_id: str, value: Any, turn: Any = None, branch: Any = None) -> int:
        """Reward call ``turn`` (None: the last so far) or branch ``branch`` of an open rollout; return which one."""
        rollout = self.get(rollout_id)
        rewards, traj = rollout.rewards, rollout.core.trajectory
        if branch is not None:
            given = rewards.give_branch(value, branch, len(traj.all_branches))
        else:
            given = rewards.give(value, turn, len(traj.turns))
        if self.journal is not None:  # on disk before the answer goes out
            _journal_reward(self.journal, rollout, given, by_branch=branch is not None)
        return given

    async def finish(
        self,
        rollout_id: str,
        reward: float | None = None,
        metadata: dict[str, Any] | None = None,
        turn_rewards: Sequence[Any] | None = None,
        ended: Outcome | None = None,
    ) -> RolloutRecord:
        """:meth:`take` (``ended`` too), write the record; ``turn_rewards`` join per-call ones, ``reward`` is the total.

        Raises:
            GatewayError: 404 unknown, 409 busy (not with ``ended``: the calls are waited for) or finished already (a
                second finish writes nothing); 400 for per-turn rewards not fitting its calls (nothing is ended then).
        """
        rollout = await _after_calls(self, rollout_id) if ended is not None else self.get(rollout_id)  # finished: 409
        total, per_turn = rollout.rewards.final(reward, turn_rewards, len(rollout.core.trajectory.turns))
        if self.journal is not None and not rollout.busy:  # busy: refused below (409), nothing to journal
            _journaled(self.journal.finished, rollout_id, total, per_turn, metadata, what="the rollout could end")
        self.registry.remove(rollout_id)
        rollout.metadata.update(metadata or {})
        traj = self._end(rollout, "finish", ended)
        per_branch = rollout.rewards.branches(traj.all_branches)
        return self.writer.write(rollout, traj, total, self.base_url, per_turn, per_branch)

    def _end(self, rollout: GatewayRollout, why: str, ended: Outcome | None) -> Trajectory:
        """Close the rollout's trajectory (:func:`close_ended`) and keep its JSON for ``GET /rollouts/<id>``."""
        core = rollout.core
        traj = core.trajectory
        traj.metadata.update({**rollout.metadata, "task_id": rollout.task_id, "gateway_end": why})
        close_ended(traj, ended)
        core.reset()  # ends the backend sequence; the new empty trajectory is never used
        for gone in self.registry.keep_finished(rollout.id, traj.to_json()):
            self.access.forget(gone)
        return traj

    async def _end_idle(self, rollout: GatewayRollout) -> None:
        timeout = self.registry.idle_timeout
        traj = self._end(rollout, "idle_timeout", Stopped(f"no call for {timeout:g} s: the gateway's idle timeout"))
        self.writer.write_ended(rollout, traj, self.base_url)
        logger.info("rollout %s ended after %g s idle", rollout.id, timeout)

    # ---------------------------------------------------------------------------------------------- calls
    async def call(
        self,
        rollout_id: str,
        front: Front,
        body: Any,
        route: Route | None = None,
        path: dict[str, str] | None = None,
        label: Label | None = None,
    ) -> tuple[Any, bool]:
        """Answer one request of ``front`` on rollout ``rollout_id``: the front's data or events, whether it streams.

        ``route``: the route it came in on (the front's first by default), ``path``: the route's parameters, ``label``:
        the call's lineage label (``X-Tito-Lineage``). Calls on one rollout may run concurrently.

        Raises:
            GatewayError: 400 (a field tito cannot honour, named as the caller wrote it), 404, 409 (finished), 503
                (shutting down), or a failed call's (:func:`~tito_core.gateway.errors.error_of`; it has a status).
        """
        rollout = self.get(rollout_id)
        _refuse_if_closing(self._closing)
        route = route or front.routes[0]
        with rollout.claim():
            context = _context(rollout, front, route, path, rollout.images)
            decoded = _decode(rollout, front, body, context)
            answer = await answer_call(rollout, decoded.request, self.model_name, label)
            if self.journal is not None:  # on disk before the answer goes out
                _journaled(self.journal.answered, rollout)
        stream = route.stream if route.stream is not None else decoded.request.stream
        if stream:
            return front.events(answer, decoded, context), True
        return front.encode(answer, decoded, context), False

    async def count(
        self, rollout_id: str, front: Front, body: Any, route: Route | None = None, path: dict[str, str] | None = None
    ) -> Any:
        """Answer a ``count`` route of ``front``: the prompt's token count, with nothing recorded.

        Text only (an image is a 400: counting reads no image, so it never touches the rollout's kept images).
        """
        rollout = self.get(rollout_id)
        route = route or next(r for r in front.routes if r.kind == "count")
        context = _context(rollout, front, route, path, ImageReader(_NO_IMAGES_WHEN_COUNTING))
        return front.count(await count_prompt(rollout, front.decode(body, context).request))


_CLOSING = "the gateway is shutting down: it takes no new rollouts or calls"


async def _after_calls(gateway: Gateway, rollout_id: str) -> GatewayRollout:
    """Open rollout ``rollout_id`` once no call runs on it: its agent ended, so the calls it left are recorded first.

    Raises:
        GatewayError: 404 unknown; 409 finished, also while waiting (the idle timeout, a shutdown).
    """
    rollout = gateway.get(rollout_id)
    while rollout.busy:
        await rollout.idle()
        rollout = gateway.get(rollout_id)
    return rollout


def _decode(rollout: GatewayRollout, front: Front, body: Any, context: Context) -> Decoded:
    """``front``'s decoding of ``body``; a 400 it raises is the rollout's status too (:meth:`Rollout.fail`)."""
    try:
        return front.decode(body, context)
    except GatewayError as exc:
        rollout.core.fail(exc)
        raise


def _refuse_if_closing(closing: bool) -> None:
    if closing:
        raise GatewayError(503, _CLOSING, code="shutting_down")


def _new_id(registry: Registry, rollout_id: str | None) -> str:
    """``rollout_id``, or a fresh one; 400 for ``.`` and ``..``, 409 for the id of a finished rollout."""
    rid = rollout_id or registry.new_id()
    if rid in (".", ".."):
        raise GatewayError(400, f"id: {rid!r} cannot be a rollout id (a URL path segment)", param="id")
    if registry.finished(rid) is not None:
        raise GatewayError(409, f"rollout {rid!r} was finished already", code="rollout_exists")
    return rid


def _journal_reward(journal: Journal, rollout: GatewayRollout, given: int, *, by_branch: bool) -> None:
    """Put a reward on disk before its answer; one the journal cannot hold is taken back (not answered: not given)."""
    kept = rollout.rewards.by_branch if by_branch else rollout.rewards.by_turn
    where = {"branch": given} if by_branch else {"turn": given}
    try:
        _journaled(journal.rewarded, rollout.id, kept[given], **where, what="the reward was valid")
    except GatewayError:
        del kept[given]
        raise


def _journaled(append: Callable[..., None], *args: Any, what: str = "the call was recorded", **kwargs: Any) -> None:
    """Append to the journal; an answer it cannot hold is not sent (507, saying ``what`` happened then)."""
    try:
        append(*args, **kwargs)
    except OSError as exc:
        message = f"{what}, but the gateway's journal could not be written ({exc}): not answered"
        raise GatewayError(507, message, code="journal_not_written") from exc


def _check_settings(api_key: str | None, idle_timeout: float, max_body_bytes: int) -> None:
    """Refuse, with a :class:`~tito_core.errors.ConfigError`, a key that is empty or blank and limits not positive."""
    if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
        raise ConfigError("api_key must be a string that is not empty or only whitespace, or None")
    if max_body_bytes <= 0:
        raise ConfigError(f"max_body_bytes must be positive, got {max_body_bytes!r}")
    if idle_timeout <= 0:
        raise ConfigError(f"idle_timeout must be positive, got {idle_timeout!r}")


def _context(
    rollout: GatewayRollout, front: Front, route: Route, path: dict[str, str] | None, images: ImageReader
) -> Context:
    """What ``front`` reads and keeps for ``rollout`` while it decodes and answers a request on ``route``."""
    if front.name not in rollout.front_states:
        rollout.front_states[front.name] = front.new_state()
    return Context(rollout.replies, images, rollout.front_states[front.name], route, path)


_NO_IMAGES_WHEN_COUNTING = "images are not counted here: count a prompt of text (no image is read)"


def served_model_name(config: TitoConfig) -> str:
    """The model name the gateway answers with.

    The tokenizer's hub name, or its directory's name (never a local path, which would tell a client about the
    machine), else the backend's name.
    """
    name = str(config.tokenizer or "")
    if not name:
        return config.backend
    path = Path(name)
    return path.name if path.is_absolute() or path.exists() or name.startswith(".") else name


def close_ended(traj: Trajectory, ended: Outcome | None) -> None:
    """Close every open branch of a rollout the gateway ends, with the status :func:`~tito_core.status.status_of` gives.

    ``ended`` (the gateway stopped it: shutdown, idle timeout; or how its agent ended) decides a branch's status
    where :func:`~tito_core.status.replaces` says so; otherwise a rollout the client finished is ``failed`` without
    any model call, a branch still ``running`` (its last output called tools) is ``aborted`` with the true reason
    (:func:`~tito_core.rollout_core.tree.close_reason`: left behind, or its tool calls unanswered), and every
    other branch keeps the status of its last call.
    """
    branches = traj.all_branches
    called = any(branch.turns for branch in branches) or bool(traj.branches)
    for branch in branches:
        if branch.closed:
            continue
        if ended is not None and replaces(ended, branch.status):
            branch.close(*status_of(ended))
        elif branch.status == "running" and not called:
            branch.close(*status_of(NoModelCall()))
        elif branch.status == "running":
            branch.close(*status_of(Closed("running", close_reason(branch, branches))))
        else:
            branch.close()


def image_refusal(vision: VisionProcessor | None, backend: Backend) -> str | None:
    """Why a gateway on ``vision`` and ``backend`` takes no images (its image parts are a 400), or None."""
    caps = backend.capabilities()
    if caps.renders_prompt:
        return f"the {caps.name} backend renders prompts itself; tito sends it no images"
    return refusal({"image"}, vision, caps.name, caps.input_kinds)
