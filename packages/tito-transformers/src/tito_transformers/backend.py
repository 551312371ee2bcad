"""The embedded backend: a Hugging Face causal LM run by ``transformers`` + ``torch`` in this process.

One worker thread owns the model and runs a continuous-batching decode loop: requests that arrive while
others are generating join the running batch at the next step (each new prompt is prefilled on its own,
then its KV cache is left-padded and stacked onto the batch's), finished or cancelled rows leave it at the
next step, and at most ``max_batch_size`` rows decode together. The event loops that call :meth:`generate`
only wait on a future, so the model never blocks them and any loop (or several) can use one backend.

This module holds the backend itself (options, the queue and the worker thread); the parts live beside it:
model loading (``_load``), request preparation (``_prepare``), the decode loop (``_batch``) and the job a
request becomes (``_job``).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import os
import threading
import time
import weakref
from typing import Any, ClassVar, Literal

from tito_core.backend import Backend, GenerateRequest, GenerateResult
from tito_core.errors import BackendError, BackendRequestError

from ._batch import _Batch
from ._job import _deliver, _Job
from ._load import _load, _placement
from ._prepare import _Preparer
from ._vision import _vision_of
from .routing import routers

__all__ = ["LogprobsMode", "TransformersBackend"]

LogprobsMode = Literal["raw", "processed"]
"""Which distribution output logprobs come from: the model's (``raw``) or the sampler's (``processed``)."""


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
    are not temperature-scaled then either. A request for sampling masks (``return_sampling_mask``, set by the core
    when sampling truncates) gets the kept set of every output token (the ids left finite after the grammar,
    ``never_sample``, top-k and top-p filters, in id order) and, whatever the mode, the processed logprobs: the
    distribution each token was sampled from, renormalised over its kept set. Prompt logprobs
    (``return_prompt_logprobs``) are always raw and unconstrained: one per ``input_ids[prefix_len:]``, None for
    position 0.
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

    Images: a vision-language model (a config with a ``vision_config``, e.g. Qwen2.5-VL) is loaded by
    ``AutoModelForImageTextToText`` and takes requests with :attr:`~tito_core.backend.GenerateRequest.media`
    (``input_kinds`` names image): each image goes through the model directory's image processor (cached by
    content hash), its grid and token count must be those of its span in ``input_ids``
    (:class:`~tito_core.errors.BackendRequestError` naming the image if not, before anything runs), and the
    prefill takes its pixel inputs and the model's 3-D positions. ``never_sample`` ids are never sampled; raw
    logprobs are the model's own (unmasked), so a plain forward pass with the images re-scores them.

    Sharing the model with a trainer: ``model=`` takes an already-loaded causal LM (a ``PreTrainedModel``, or a
    ``peft`` model wrapping one) and generates with that very module -- not a copy -- so weights a trainer
    updates in place between rounds are what the next request decodes with. The backend puts it in eval mode
    when built; nothing it keeps between requests depends on the weights (each request prefills its own KV
    cache, finished rows leave the batch), so a request queued after an update sees only the new weights.
    Do not update the weights while requests are in flight, and call ``model.eval()`` again (or build a new
    backend, as each ``tito_core.rollout`` call does) after training put it in train mode.

    MoE routing: a request with ``return_routed_experts`` gets the experts every token it fed was routed to, captured
    by forward hooks on the model's routers (:mod:`tito_transformers.routing`): int32 rows of ``layers x top_k`` from
    position ``prefix_len - 1`` to the last token but one. A model without MoE layers (or whose routers do not return
    their expert ids) answers without them, and the core records the routing as missing.

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
    supports_sampling_mask: ClassVar[bool] = True

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

        model_path, device, dtype = _placement(model_path, model, dtype, device, attn_implementation)
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, not {max_batch_size}")
        if logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed', not {logprobs_mode!r}")
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.model_path = model_path
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype)
        self.max_batch_size = max_batch_size
        self.batch_wait_s = max(batch_wait_ms, 0.0) / 1000.0
        self.logprobs_mode: LogprobsMode = logprobs_mode
        self.weight_version = weight_version
        loaded = _load(self.model_path, model, self.device, self.dtype, attn_implementation, max_context_length)
        self.model: Any = loaded.model
        self.eos_token_ids: frozenset[int] = loaded.eos_token_ids
        self._mergeable = loaded.mergeable  # False: one request at a time (tests set it to check that path)
        self._preparer = _Preparer(
            self.name, self.model_path, self.device, loaded.vocab, loaded.context, loaded.defaults, self.eos_token_ids
        )
        self._vision = _vision_of(self.name, self.model_path, self.model)
        self._routers = routers(self.model)  # MoE routers: a request's routed experts are captured from them
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

    @property  # a property here: it depends on the model loaded
    def input_kinds(self) -> frozenset[str]:
        """The kinds the model takes: images for a vision-language model (a ``vision_config`` and an image token)."""
        return self._vision.kinds if self._vision is not None else frozenset()

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Queue the request for the worker thread and wait for its result; cancelling stops it."""
        loop = asyncio.get_running_loop()
        job = _Job(request, loop, loop.create_future())
        constraint = self._preparer.prepare(job)
        if request.media and self._vision is None:
            raise BackendRequestError(
                f"the model at {self.model_path} is text-only (no vision_config): it cannot take images or videos",
                field="media",
                backend=self.name,
            )
        vision = self._vision
        if vision is not None and (request.media or any(t in job.input_ids for t in vision.token_ids.values())):
            # checks every placeholder belongs to an item; the processor takes milliseconds per new image
            job.pixels = await asyncio.to_thread(vision.pixels, request)
        if constraint is not None:  # compiling may build the tokenizer info (up to a second): off the loop
            await asyncio.to_thread(self._preparer.constrain, job, *constraint)
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

    def sampling_defaults(self) -> dict[str, Any]:
        """The model's ``generation_config`` sampling defaults (temperature, top_p, top_k), which unset fields take."""
        return dict(self._preparer.defaults)

    async def max_context_length(self) -> int | None:
        """The context window: ``max_context_length`` if given, else the config's ``max_position_embeddings``."""
        return int(self._preparer.context) if self._preparer.context else None

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

    @property
    def _tokenizer(self) -> Any:
        """The model's tokenizer once a stop string or grammar needed it (the decode loop matches stop strings)."""
        return self._preparer.tokenizer

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


def _close_at_exit(ref: weakref.ref[TransformersBackend]) -> None:
    backend = ref()
    if backend is not None:
        backend.close()
