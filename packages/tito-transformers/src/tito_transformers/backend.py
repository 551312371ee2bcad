"""The embedded backend: a Hugging Face causal LM run by ``transformers`` + ``torch`` in this process.

One worker thread owns the model and runs a continuous-batching decode loop: requests that arrive while
others are generating join the running batch at the next step (each new prompt is prefilled on its own,
then its KV cache is left-padded and stacked onto the batch's), finished or cancelled rows leave it at the
next step, and at most ``max_batch_size`` rows decode together. The event loops that call :meth:`generate`
only wait on a future, so the model never blocks them and any loop (or several) can use one backend.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import functools
import inspect
import math
import os
import re
import secrets
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from tito_core.backend import Backend, FinishReason, GenerateRequest, GenerateResult, SamplingParams
from tito_core.errors import BackendError, BackendRequestError, ContextLengthError
from tito_core.versions import VersionSpan

if TYPE_CHECKING:
    import torch

__all__ = ["LogprobsMode", "TransformersBackend"]

LogprobsMode = Literal["raw", "processed"]
"""Which distribution output logprobs come from: the model's (``raw``) or the sampler's (``processed``)."""

_DTYPES = ("bfloat16", "float16", "float32")
_PROMPT_LOGPROB_CHUNK = 256  # positions whose log-softmax is taken at once (bounds the float32 copy)
_XGRAMMAR_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")  # "[11:05:54] /project/cpp/grammar_parser.cc:820: "


class _Job:
    """One request as the worker sees it; fields after ``future`` are written by the worker thread only."""

    __slots__ = (
        "bitmask",
        "cancelled",
        "future",
        "generator",
        "greedy",
        "input_ids",
        "logprobs",
        "loop",
        "matcher",
        "max_new",
        "output_ids",
        "position",
        "prefix_len",
        "prompt_logprobs",
        "request",
        "stop_ids",
        "stop_strings",
        "temperature",
        "top_k",
        "top_p",
        "versions",
    )

    def __init__(self, request: GenerateRequest, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> None:
        self.request = request
        self.input_ids = [int(i) for i in request.input_ids]
        self.prefix_len = request.prefix_len
        self.loop = loop
        self.future = future
        self.cancelled = False  # set from the event loop's thread; read by the worker between steps
        self.temperature = 1.0
        self.greedy = False
        self.top_p = 1.0
        self.top_k = 0
        self.max_new = 0
        self.stop_ids: frozenset[int] = frozenset()
        self.stop_strings: tuple[str, ...] = ()
        self.generator: torch.Generator | None = None
        self.matcher: Any = None  # xgrammar.GrammarMatcher of a constrained request (set before it is queued)
        self.bitmask: torch.Tensor | None = None  # its next-token mask, one bit per vocabulary id
        self.output_ids: list[int] = []
        self.logprobs: list[float] = []
        self.prompt_logprobs: list[float | None] | None = None
        self.position = 0  # tokens of this row already in the KV cache
        self.versions: list[tuple[str | None, int]] = []  # (weight version, first output index) at each change


class TransformersBackend(Backend):
    """Generate with a Hugging Face causal LM in this process: token ids in, ids and logprobs out.

    Sampling follows the engines (vLLM, SGLang): ``temperature`` 0 is greedy; ``top_k`` (0 or -1: off) and
    ``top_p`` filter the temperature-scaled distribution; ``seed`` makes one request reproducible (each
    request samples from its own ``torch.Generator``); generation ends with finish ``"stop"`` on an EOS id of
    the model's ``generation_config`` (unless ``ignore_eos``) or on one of ``stop_token_ids`` -- the stop token
    included in ``output_ids`` and reported as ``matched_stop`` -- or on a ``stop`` string (the tokens that
    complete it are kept), and with ``"length"`` at ``max_new_tokens`` or at the end of the context window.
    Unset parameters take the model's ``generation_config.json`` defaults when it has them (as vLLM does),
    else temperature 1, no top-k/top-p.

    Logprobs: by default (``logprobs_mode="raw"``) output logprobs are ``log_softmax`` of the model's logits,
    before temperature, top-k and top-p -- vLLM's default (``raw_logprobs``), and the same numbers as prompt
    logprobs when the ids are scored again (not under a grammar: both modes are then post-constraint, see
    below). ``logprobs_mode="processed"`` reports the distribution the token was actually sampled from (after
    temperature and the top-k/top-p filters, renormalised), like vLLM's ``processed_logprobs``; greedy requests
    are not temperature-scaled then either. Prompt logprobs (``return_prompt_logprobs``) are always raw and
    unconstrained: one per ``input_ids[prefix_len:]``, None for position 0.
    Everything is computed in float32 from the model's logits.

    Constrained decoding: a request with :attr:`~tito_core.backend.GenerateRequest.grammar` (EBNF in the
    xgrammar / GBNF dialect vLLM and SGLang read) or ``sampling.extra["regex"]`` (SGLang's name) decodes under
    it with `xgrammar <https://github.com/mlc-ai/xgrammar>`_, the engines' default grammar library, each row
    of a batch under its own constraint (or none). Before sampling, the tokens the grammar forbids get logit
    -inf; stop tokens are allowed only once the grammar is complete, so generation ends with ``"stop"`` when
    the grammar is complete and a stop token (EOS, or one of ``stop_token_ids``; the model's EOS even under
    ``ignore_eos``) is sampled, or with ``"length"`` at ``max_new_tokens``. Under a constraint, output
    logprobs (both modes) come from the constrained distribution -- the masked logits, renormalised -- as
    vLLM and SGLang report them; scoring the same ids again without the constraint (as prompt logprobs do)
    can give very different numbers (up to 12 nats lower measured on the engines). A grammar or regex that does
    not compile raises :class:`~tito_core.errors.BackendRequestError` before anything is generated. The
    tokenizer information the masks need is built on the first constrained request (about 0.2 s for a
    49k vocabulary, 0.8 s for 151k); compiled grammars are cached by text.

    Concurrency: requests waiting when the worker is idle are gathered for ``batch_wait_ms`` and decoded
    together; requests arriving later join the running batch at the next step (up to ``max_batch_size``
    rows). Cancelling :meth:`generate` removes the request from the batch at the next decoding step.
    Greedy output does not depend on what else is in the batch (up to floating-point ties).

    Sharing the model with a trainer: ``model=`` takes an already-loaded causal LM (a ``PreTrainedModel``, or a
    ``peft`` model wrapping one) and generates with that very module -- not a copy -- so weights a trainer
    updates in place between rounds are what the next request decodes with. The backend puts it in eval mode
    when built; nothing it keeps between requests depends on the weights (each request prefills its own KV
    cache, finished rows leave the batch), so a request queued after an update sees only the new weights.
    Do not update the weights while requests are in flight, and call ``model.eval()`` again (or build a new
    backend, as each ``tito_core.rollout`` call does) after training put it in train mode.

    Weight versions: the backend cannot tell weights apart, so its caller labels them: ``weight_version`` (an
    option, and an attribute the trainer can set after each update) is recorded with every token sampled while
    it is set, as spans on the result (:attr:`~tito_core.backend.GenerateResult.weight_versions`; an int is
    recorded as its decimal text). Unset (None, the default), the results carry no versions. A request whose
    tokens were sampled partly without a version reports none.

    Args:
        model_path: A directory (or hub id, when the hub is reachable) loadable by
            ``AutoModelForCausalLM.from_pretrained``. With ``model``: where the tokenizer (for grammars and stop
            strings) and ``generation_config.json`` are read from; default the model's ``name_or_path``.
        model: An already-loaded model to generate with, used as is: not copied, not moved, not cast (``dtype``
            and ``attn_implementation`` must then be left unset, and ``device`` defaults to the model's).
        dtype: Weights and activations: ``"bfloat16"``, ``"float16"`` or ``"float32"``; default float32 on CPU
            (bfloat16 matmuls are many times slower on CPUs without bfloat16 instructions) and bfloat16 elsewhere.
        device: Torch device, e.g. ``"cpu"`` or ``"cuda"`` (default ``"cpu"``, or the device of ``model``).
        max_batch_size: Most requests decoded together; more wait in the queue.
        batch_wait_ms: How long an idle worker waits for companions of a first request before prefilling.
        max_context_length: The context window; default ``max_position_embeddings`` of the model config.
        logprobs_mode: ``"raw"`` (default) or ``"processed"``, see above.
        num_threads: ``torch.set_num_threads`` for the process (None: leave torch's default).
        attn_implementation: Passed to ``from_pretrained`` (default ``"sdpa"``).
        weight_version: The version of the weights (e.g. the trainer's step), recorded with each sampled token;
            None records no versions.

    Raises:
        ValueError: Neither ``model_path`` nor ``model``; ``dtype`` or ``attn_implementation`` with ``model``; a
            ``device`` other than the model's; a bad option value.
    """

    name: ClassVar[str] = "transformers"
    supports_grammar: ClassVar[bool] = True

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        model: Any = None,
        dtype: str | None = None,
        device: str | None = None,
        max_batch_size: int = 16,
        batch_wait_ms: float = 2.0,
        max_context_length: int | None = None,
        logprobs_mode: LogprobsMode = "raw",
        num_threads: int | None = None,
        attn_implementation: str | None = None,
        weight_version: str | int | None = None,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        if model is not None:
            model_path, device = _shared_model(model, model_path, device, dtype, attn_implementation)
        elif model_path is None:
            raise ValueError("give `model_path` (a model directory) or `model` (an already-loaded model)")
        device = device or "cpu"
        if dtype is None:  # CPUs without bfloat16 units run bfloat16 several times slower than float32
            dtype = "float32" if torch.device(device).type == "cpu" else "bfloat16"
        if model is not None:
            dtype = str(model.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, not {dtype!r}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, not {max_batch_size}")
        if logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed', not {logprobs_mode!r}")
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.model_path = str(model_path)
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype)
        self.max_batch_size = max_batch_size
        self.batch_wait_s = max(batch_wait_ms, 0.0) / 1000.0
        self.logprobs_mode: LogprobsMode = logprobs_mode
        self.weight_version = weight_version
        if model is None:
            loaded: Any = AutoModelForCausalLM.from_pretrained(
                self.model_path, dtype=self.dtype, attn_implementation=attn_implementation or "sdpa"
            )
            model = loaded.to(self.device)
        self.model: Any = model.eval()  # a shared model: the same module, put in eval mode (no dropout)
        config = self.model.config.get_text_config(decoder=True)
        self._context = max_context_length or getattr(config, "max_position_embeddings", None)
        self._vocab = int(config.vocab_size)
        try:
            generation = GenerationConfig.from_pretrained(self.model_path).to_diff_dict()
        except OSError:  # no generation_config.json: the model config's ids only
            generation = {}
        eos = generation.get("eos_token_id", getattr(config, "eos_token_id", None))
        self.eos_token_ids: frozenset[int] = frozenset(
            int(i) for i in ([] if eos is None else eos if isinstance(eos, list) else [eos])
        )
        self._defaults = {
            key: generation[key] for key in ("temperature", "top_p", "top_k") if generation.get(key) is not None
        }
        if generation.get("do_sample") is False:
            self._defaults["temperature"] = 0.0
        self._mergeable = self._plain_dynamic_cache()
        self._tokenizer: Any = None
        self._compiler: Any = None  # xgrammar.GrammarCompiler, built on the first constrained request
        self._compiler_lock = threading.Lock()
        self._lock = threading.Condition()
        self._queue: collections.deque[_Job] = collections.deque()
        self._closed = False
        self._thread: threading.Thread | None = None

    # --- public API ---------------------------------------------------------------------------------

    @property
    def weight_version(self) -> str | None:
        """The version recorded with the tokens sampled from now on (set it after each weight update)."""
        return self._weight_version

    @weight_version.setter
    def weight_version(self, value: str | int | None) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, str | int) or value == ""):
            raise ValueError(f"weight_version must be a non-empty str, an int or None, not {value!r}")
        self._weight_version = None if value is None else str(value)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Queue the request for the worker thread and wait for its result; cancelling stops it."""
        loop = asyncio.get_running_loop()
        job = _Job(request, loop, loop.create_future())
        constraint = self._prepare(job)
        if constraint is not None:  # compiling may build the tokenizer info (up to a second): off the loop
            await asyncio.to_thread(self._constrain, job, *constraint)
        with self._lock:
            if self._closed:
                raise BackendError("the transformers backend is closed", backend=self.name)
            self._queue.append(job)
            self._start_worker()
            self._lock.notify()
        try:
            result: GenerateResult = await job.future
        except asyncio.CancelledError:
            job.cancelled = True  # the worker drops the row at its next step
            raise
        return result

    async def max_context_length(self) -> int | None:
        """The context window: ``max_context_length`` if given, else the config's ``max_position_embeddings``."""
        return int(self._context) if self._context else None

    async def aclose(self) -> None:
        """Stop the worker thread; requests still queued or running fail with a :class:`BackendError`."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Blocking form of :meth:`aclose`, for code outside an event loop (it waits for the current step)."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # --- request preparation (caller's thread) ------------------------------------------------------

    def _prepare(self, job: _Job) -> tuple[str, str] | None:
        """Check the request and fill the job's sampling fields; returns its constraint ``(field, text)``, if any."""
        import torch

        request, sampling = job.request, job.request.sampling
        if not job.input_ids:
            raise ValueError("input_ids is empty: the transformers backend needs at least one prompt token")
        if not 0 <= request.prefix_len <= len(job.input_ids):
            raise ValueError(f"prefix_len {request.prefix_len} is outside the prompt (length {len(job.input_ids)})")
        bad = [i for i in job.input_ids if not 0 <= i < self._vocab]
        if bad:
            raise ValueError(f"input id {bad[0]} is outside the model's vocabulary (size {self._vocab})")
        constraint = self._constraint(request)
        room = (self._context - len(job.input_ids)) if self._context else None
        if room is not None and room <= 0:
            raise ContextLengthError(
                f"prompt of {len(job.input_ids)} tokens does not fit the context window of {self._context}",
                backend=self.name,
            )
        limit = sampling.max_new_tokens
        if limit is not None and limit < 0:
            raise ValueError(f"max_new_tokens must be >= 0, not {limit}")
        if limit is None:
            limit = room if room is not None else 2**31
        job.max_new = min(limit, room) if room is not None else limit
        temperature = self._pick(sampling, "temperature", 1.0)
        top_p = self._pick(sampling, "top_p", 1.0)
        top_k = int(self._pick(sampling, "top_k", 0))
        if temperature < 0 or not 0 < top_p <= 1:
            raise ValueError(f"temperature must be >= 0 and top_p in (0, 1], got {temperature} and {top_p}")
        job.temperature = float(temperature)
        job.greedy = temperature < 1e-5 or top_k == 1
        job.top_p = float(top_p)
        job.top_k = top_k if top_k > 0 else 0
        stop = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            stop |= self.eos_token_ids
        job.stop_ids = frozenset(stop)
        job.stop_strings = tuple(s for s in sampling.stop if s)
        if job.stop_strings:
            self._load_tokenizer()
        if not job.greedy:
            seed = sampling.seed if sampling.seed is not None else secrets.randbits(63)
            job.generator = torch.Generator(device=self.device).manual_seed(seed)
        return constraint

    def _constraint(self, request: GenerateRequest) -> tuple[str, str] | None:
        """The request's grammar or regex as ``(field, text)``; refuses any other ``sampling.extra``."""
        extra = request.sampling.extra
        unknown = sorted(key for key in extra if key != "regex")
        if unknown:
            raise ValueError(
                f"the transformers backend does not support sampling extra {unknown} (it reads only `regex`, "
                "for regex-constrained decoding; engine-specific options have no meaning here)"
            )
        regex = extra.get("regex")
        if regex is not None and not isinstance(regex, str):
            raise BackendRequestError(
                f"`sampling.extra.regex` must be a string, got {type(regex).__name__}",
                field="sampling.extra.regex",
                value=regex,
                backend=self.name,
            )
        if regex is not None and request.grammar is not None:
            raise BackendRequestError(
                "a request takes a grammar or `sampling.extra.regex`, not both",
                field="sampling.extra.regex",
                value=regex,
                backend=self.name,
            )
        if request.grammar is not None:
            return "grammar", request.grammar
        return ("sampling.extra.regex", regex) if regex is not None else None

    def _constrain(self, job: _Job, field: str, text: str) -> None:
        """Compile ``text`` (cached by xgrammar) and give the job a matcher; a bad one raises BackendRequestError."""
        import xgrammar

        compiler = self._grammar_compiler()
        try:
            compiled = (
                compiler.compile_regex(text) if field == "sampling.extra.regex" else compiler.compile_grammar(text)
            )
        except RuntimeError as exc:
            reason = _XGRAMMAR_PREFIX.sub("", str(exc)).strip()
            what = "regex" if field == "sampling.extra.regex" else "grammar"
            raise BackendRequestError(
                f"invalid {what} (`{field}`): {reason}", field=field, value=text[:200], backend=self.name
            ) from exc
        stops = sorted(job.stop_ids) or sorted(self.eos_token_ids)  # under ignore_eos the grammar still ends
        job.matcher = xgrammar.GrammarMatcher(
            compiled, override_stop_tokens=stops or None, terminate_without_stop_token=not stops
        )
        job.bitmask = xgrammar.allocate_token_bitmask(1, self._vocab)

    def _grammar_compiler(self) -> Any:
        """The xgrammar compiler for this model's vocabulary, built once (thread-safe)."""
        with self._compiler_lock:
            if self._compiler is None:
                import xgrammar

                self._load_tokenizer()
                info = xgrammar.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self._vocab, stop_token_ids=sorted(self.eos_token_ids) or None
                )
                self._compiler = xgrammar.GrammarCompiler(info)
            return self._compiler

    def _pick(self, sampling: SamplingParams, field: str, default: float) -> float:
        value = getattr(sampling, field)
        if value is None:
            value = self._defaults.get(field, default)
        return float(value)

    def _load_tokenizer(self) -> None:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            try:
                self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            except (OSError, ValueError) as exc:
                raise ValueError(f"stop strings and grammars need the model's tokenizer, which failed: {exc}") from exc

    # --- worker thread ------------------------------------------------------------------------------

    def _start_worker(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=f"tito-transformers-{id(self):x}", daemon=True)
            self._thread.start()
            # A daemon worker still inside a forward pass when the interpreter finalizes aborts the process
            # ("terminate called without an active exception", e.g. after an exception ended asyncio.run with
            # requests in flight): stop it at exit, after the current step.
            atexit.register(_close_at_exit, weakref.ref(self))

    def _run(self) -> None:
        import torch

        batch = _Batch(self)
        with torch.inference_mode():
            while True:
                jobs = self._take(batch)
                if jobs is None:
                    break
                try:
                    if jobs:
                        batch.admit(jobs)
                    if batch.rows:
                        batch.step()
                except Exception as exc:  # a failed forward fails the requests in it, not the worker
                    error = BackendError(f"generation failed: {type(exc).__name__}: {exc}", backend=self.name)
                    for job in [*batch.rows, *jobs]:
                        _deliver(job, error)
                    batch = _Batch(self)
        error = BackendError("the transformers backend was closed", backend=self.name)
        for job in [*batch.rows, *self._queue]:
            _deliver(job, error)
        self._queue.clear()

    def _take(self, batch: _Batch) -> list[_Job] | None:
        """Queued requests to admit now (possibly none); None when the backend is closed."""
        with self._lock:
            while not self._closed and not batch.rows and not self._queue:
                self._lock.wait()
            if self._closed:
                return None
            if not self._mergeable:  # this model's cache cannot be stacked: one request at a time
                if batch.rows:
                    return []
                job = self._queue.popleft()
                return [] if job.cancelled else [job]
            idle = not batch.rows
        if idle and self.batch_wait_s:
            deadline = time.monotonic() + self.batch_wait_s
            with self._lock:
                while len(self._queue) < self.max_batch_size and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._lock.wait(left)
        with self._lock:
            jobs: list[_Job] = []
            while self._queue and len(batch.rows) + len(jobs) < self.max_batch_size:
                job = self._queue.popleft()
                if not job.cancelled:
                    jobs.append(job)
            return jobs

    def _plain_dynamic_cache(self) -> bool:
        """True when the model's KV cache is plain full-attention layers, whose rows can be padded and stacked."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        try:
            cache = DynamicCache(config=self.model.config)
        except Exception:
            return False
        layers = getattr(cache, "layers", None) or []
        return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


class _Batch:
    """The rows decoding together, with their stacked KV cache and attention mask (worker thread only)."""

    def __init__(self, backend: TransformersBackend) -> None:
        self.backend = backend
        self.rows: list[_Job] = []
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # [rows, cache length], 0 on left padding
        self.pending: list[int] = []  # the last sampled token of each row, not yet in the cache

    def admit(self, jobs: list[_Job]) -> None:
        """Prefill each new request, sample its first token, and stack the unfinished ones onto the batch."""
        import torch

        caches: list[Any] = []
        joined: list[_Job] = []
        for job in jobs:
            cache, first = self._prefill(job)
            if first is None:
                continue
            caches.append(cache)
            joined.append(job)
            self.pending.append(first)
        if not joined:
            return
        parts: list[tuple[Any, torch.Tensor]] = [(self.cache, self.mask)] if self.mask is not None else []
        parts += [
            (cache, torch.ones(1, job.position, dtype=torch.long, device=self.backend.device))
            for cache, job in zip(caches, joined, strict=True)
        ]
        self.rows.extend(joined)
        self.cache, self.mask = _stack(parts, self.backend.model.config) if len(parts) > 1 else parts[0]

    def _prefill(self, job: _Job) -> tuple[Any, int | None]:
        """Run the prompt; returns its cache and first token, or ``(None, None)`` when the job already ended."""
        import torch
        from transformers import DynamicCache

        backend = self.backend
        ids = job.input_ids
        want_prompt = job.request.return_prompt_logprobs
        first_scored = max(job.prefix_len, 1)  # position 0 has no logprob
        keep = max(len(ids) - first_scored + 1, 1) if want_prompt else 1
        cache = DynamicCache(config=backend.model.config)
        out = backend.model(
            input_ids=torch.tensor([ids], device=backend.device),
            use_cache=True,
            logits_to_keep=keep,
            **{_cache_keyword(backend.model): cache},
        )
        logits = out.logits[0]  # [keep, vocab]: positions len(ids) - keep ... len(ids) - 1
        job.position = len(ids)
        if want_prompt:
            scored = _token_logprobs(logits[:-1], ids[first_scored:]) if first_scored < len(ids) else []
            job.prompt_logprobs = [None] * (first_scored - job.prefix_len) + list(scored)
        if job.max_new == 0:
            _finish(job, "length")
            return None, None
        token = self._sample(job, logits[-1])
        if self._ended(job):
            return None, None
        return _cache_of(out), token

    def step(self) -> None:
        """Feed every row's pending token, sample the next, and drop the rows that ended or were cancelled."""
        import torch

        backend = self.backend
        assert self.mask is not None
        self._drop([i for i, job in enumerate(self.rows) if job.cancelled])
        if not self.rows:
            return
        device = backend.device
        mask = torch.cat([self.mask, torch.ones(len(self.rows), 1, dtype=torch.long, device=device)], dim=1)
        out = backend.model(
            input_ids=torch.tensor([[t] for t in self.pending], device=device),
            attention_mask=mask,
            position_ids=torch.tensor([[job.position] for job in self.rows], device=device),
            use_cache=True,
            logits_to_keep=1,
            **{_cache_keyword(backend.model): self.cache},
        )
        self.cache, self.mask = _cache_of(out), mask
        logits = out.logits[:, -1]
        ended: list[int] = []
        for i, job in enumerate(self.rows):
            job.position += 1
            self.pending[i] = self._sample(job, logits[i])
            if self._ended(job):
                ended.append(i)
        self._drop(ended)

    def _drop(self, indices: list[int]) -> None:
        import torch

        if not indices:
            return
        gone = set(indices)
        keep = [i for i in range(len(self.rows)) if i not in gone]
        self.rows = [self.rows[i] for i in keep]
        self.pending = [self.pending[i] for i in keep]
        if not keep:
            self.cache = self.mask = None
            return
        assert self.mask is not None
        index = torch.tensor(keep, device=self.backend.device)
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]
        if self.backend._mergeable:  # drop the left padding no remaining row needs
            start = int(self.mask.any(dim=0).int().argmax())
            if start:
                self.mask = self.mask[:, start:]
                for layer in self.cache.layers:
                    layer.keys = layer.keys[:, :, start:]
                    layer.values = layer.values[:, :, start:]

    def _sample(self, job: _Job, logits: torch.Tensor) -> int:
        """Pick the next token of ``job`` from its logits row and record it with its logprob."""
        import torch

        logits = logits.float()
        if job.matcher is not None:  # constrained: forbidden tokens get -inf, in every distribution below
            logits = _masked(job, logits)
        scaled = logits if job.greedy else logits / job.temperature
        if job.top_k and job.top_k < scaled.numel():
            kth = torch.topk(scaled, job.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, -math.inf)
        if job.top_p < 1.0:
            ordered, order = torch.sort(scaled, descending=True)
            probs = torch.softmax(ordered, dim=-1)
            before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens ranked above each one
            cut = before > job.top_p
            cut[0] = False
            scaled = scaled.scatter(0, order, ordered.masked_fill(cut, -math.inf))
        if job.greedy:
            token = int(torch.argmax(scaled))
        else:
            probs = torch.softmax(scaled, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=job.generator))
        source = logits if self.backend.logprobs_mode == "raw" else scaled
        logprob = float(source[token] - torch.logsumexp(source, dim=-1))
        version = self.backend.weight_version
        if not job.versions or job.versions[-1][0] != version:
            job.versions.append((version, len(job.output_ids)))
        job.output_ids.append(token)
        job.logprobs.append(logprob)
        return token

    def _ended(self, job: _Job) -> bool:
        """Finish ``job`` if its last token ends it (stop id, stop string, token limit); True when finished."""
        token = job.output_ids[-1]
        if job.matcher is not None and not job.matcher.accept_token(token):
            # cannot happen while the mask holds; fail this request alone rather than the batch
            _deliver(job, BackendError(f"token {token} broke the request's grammar", backend=self.backend.name))
            return True
        if token in job.stop_ids:
            _finish(job, "stop", token)
        elif job.matcher is not None and job.matcher.is_terminated():  # grammar done: EOS under ignore_eos
            _finish(job, "stop", token if token in self.backend.eos_token_ids else None)
        elif job.stop_strings and (matched := self._stop_string(job)) is not None:
            _finish(job, "stop", matched)
        elif len(job.output_ids) >= job.max_new:
            _finish(job, "length")
        else:
            return False
        return True

    def _stop_string(self, job: _Job) -> str | None:
        tokenizer = self.backend._tokenizer
        longest = max(len(s) for s in job.stop_strings)
        # the newest token's text plus enough earlier text to hold a stop string that ends in it
        tail = tokenizer.decode(job.output_ids[-(longest + 1) :], skip_special_tokens=False)
        before = tokenizer.decode(job.output_ids[-(longest + 1) : -1], skip_special_tokens=False)
        for stop in job.stop_strings:
            at = tail.find(stop, max(len(before) - len(stop) + 1, 0))
            if at >= 0:
                return stop
        return None


def _stack(parts: Sequence[tuple[Any, torch.Tensor]], config: Any) -> tuple[Any, torch.Tensor]:
    """Left-pad the KV caches (and masks) of several row groups to one length and stack them by row."""
    import torch
    from transformers import DynamicCache

    length = max(mask.shape[1] for _, mask in parts)

    def pad(tensor: torch.Tensor, missing: int, dim: int) -> torch.Tensor:
        if not missing:
            return tensor
        shape = list(tensor.shape)
        shape[dim] = missing
        return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)

    masks = torch.cat([pad(mask, length - mask.shape[1], 1) for _, mask in parts])
    layers = []
    for index in range(len(parts[0][0].layers)):
        keys = [pad(cache.layers[index].keys, length - m.shape[1], 2) for cache, m in parts]
        values = [pad(cache.layers[index].values, length - m.shape[1], 2) for cache, m in parts]
        layers.append((torch.cat(keys), torch.cat(values)))
    return DynamicCache(layers, config=config), masks


def _masked(job: _Job, logits: torch.Tensor) -> torch.Tensor:
    """``logits`` (float32, one row) with the tokens the job's grammar forbids next set to -inf."""
    import xgrammar

    assert job.bitmask is not None
    if not job.matcher.fill_next_token_bitmask(job.bitmask):  # everything allowed
        return logits
    rows = logits[None]  # in place: this row of the step's logits (or its float32 copy) is not read again
    xgrammar.apply_token_bitmask_inplace(rows, job.bitmask.to(logits.device, non_blocking=True))
    return logits


def _token_logprobs(logits: torch.Tensor, targets: Sequence[int]) -> list[float]:
    """``log_softmax(logits[i])[targets[i]]`` in float32, a chunk of positions at a time."""
    import torch

    values: list[float] = []
    for start in range(0, len(targets), _PROMPT_LOGPROB_CHUNK):
        rows = logits[start : start + _PROMPT_LOGPROB_CHUNK].float()
        index = torch.tensor(targets[start : start + _PROMPT_LOGPROB_CHUNK], device=rows.device)
        picked = rows.gather(1, index[:, None])[:, 0] - torch.logsumexp(rows, dim=-1)
        values.extend(picked.tolist())
    return values


def _finish(job: _Job, reason: FinishReason, matched: str | int | None = None) -> None:
    request = job.request
    result = GenerateResult(
        output_ids=list(job.output_ids),
        output_logprobs=list(job.logprobs) if request.return_logprobs else None,
        finish_reason=reason,
        matched_stop=matched,
        prompt_ids=job.input_ids,
        prompt_logprobs=job.prompt_logprobs if request.return_prompt_logprobs else None,
        prompt_tokens=len(job.input_ids),
        cached_tokens=0,
        weight_versions=_spans(job),
    )
    _deliver(job, result)


def _spans(job: _Job) -> tuple[VersionSpan, ...] | None:
    """The job's version spans over its output; None when it has no output or a token was sampled unlabelled."""
    if not job.versions or any(version is None for version, _ in job.versions):
        return None
    ends = [start for _, start in job.versions[1:]] + [len(job.output_ids)]
    return tuple(
        VersionSpan(version=version, start=start, end=end)
        for (version, start), end in zip(job.versions, ends, strict=True)
        if version is not None
    )


def _shared_model(
    model: Any, model_path: str | os.PathLike[str] | None, device: str | None, dtype: str | None, attn: str | None
) -> tuple[str, str]:
    """Check the options given with an already-loaded ``model``; returns its ``(model_path, device)``."""
    import torch

    if dtype is not None or attn is not None:
        raise ValueError("`dtype` and `attn_implementation` apply to a model loaded from `model_path`, not to `model`")
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise ValueError(
            f"`model` must be a loaded causal LM (a torch module with a config), not {type(model).__name__}"
        )
    own = next(model.parameters()).device
    want = torch.device(device) if device is not None else own
    if want.type != own.type or want.index not in (None, own.index):
        raise ValueError(f"`model` is on {own}, not on the `device` given ({device}); move it first")
    if model_path is None:
        model_path = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
        if not model_path:
            raise ValueError("`model` has no `name_or_path`: give `model_path` (its tokenizer's directory)")
    return str(model_path), str(own)


def _close_at_exit(ref: weakref.ref[TransformersBackend]) -> None:
    backend = ref()
    if backend is not None:
        backend.close()


def _deliver(job: _Job, outcome: GenerateResult | BaseException) -> None:
    """Resolve the job's future on its own event loop (ignored if it was cancelled or the loop is gone)."""

    def resolve() -> None:
        if job.future.done():
            return
        if isinstance(outcome, BaseException):
            job.future.set_exception(outcome)
        else:
            job.future.set_result(outcome)

    with contextlib.suppress(RuntimeError):  # the loop was closed: nobody waits for this answer
        job.loop.call_soon_threadsafe(resolve)


@functools.cache
def _forward_keyword(forward: Any) -> str:
    params = inspect.signature(forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_keyword(model: Any) -> str:
    """The KV-cache argument of ``model``'s forward: ``cache`` from transformers 5.24, ``past_key_values`` before.

    transformers 5.24 warns on the old name.
    """
    return _forward_keyword(type(model).forward)


def _cache_of(out: Any) -> Any:
    """The KV cache of a forward's output, under its current name (``cache``) or its old one."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values
