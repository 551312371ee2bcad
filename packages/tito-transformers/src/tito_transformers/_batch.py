"""The embedded backend's decode loop: the rows decoding together, their stacked KV cache, and token sampling.

:class:`_Batch` runs on the worker thread only. It prefills each admitted request on its own, left-pads and
stacks its KV cache onto the running rows', feeds one token per row per step, samples each row's next token
under its own settings (and grammar), and drops the rows that ended or were cancelled. It reads its backend
through :class:`_Host`, the few settings it needs, read live (``weight_version`` changes between requests).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tito_core.errors import BackendError

from ._job import _deliver, _finish, _Job, routing_start
from ._vision import _rope_positions
from .routing import RoutingCapture

if TYPE_CHECKING:
    import torch

    from ._vision import _Vision

_PROMPT_LOGPROB_CHUNK = 256  # positions whose log-softmax is taken at once (bounds the float32 copy)

logger = logging.getLogger("tito")


class _Host(Protocol):
    """What the decode loop reads from its backend (``TransformersBackend``); it writes nothing there."""

    @property
    def name(self) -> str: ...
    @property
    def model(self) -> Any: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def logprobs_mode(self) -> str: ...
    @property
    def eos_token_ids(self) -> frozenset[int]: ...
    @property
    def weight_version(self) -> str | None: ...
    @property
    def _mergeable(self) -> bool: ...  # the model's cache rows can be padded and stacked
    @property
    def _tokenizer(self) -> Any: ...  # loaded before a request with stop strings is queued
    @property
    def _vision(self) -> _Vision | None: ...  # a vision model's image side (requests with images)
    @property
    def _routers(self) -> tuple[Any, ...]: ...  # the model's MoE routers (empty: no routing to capture)


class _Batch:
    """The rows decoding together, with their stacked KV cache and attention mask (worker thread only)."""

    def __init__(self, backend: _Host) -> None:
        self.backend = backend
        self.rows: list[_Job] = []
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # [rows, cache length], 0 on left padding
        self.pending: list[int] = []  # the last sampled token of each row, not yet in the cache
        self.capture = RoutingCapture(backend._routers) if backend._routers else None

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
        input_ids = torch.tensor([ids], device=backend.device)
        with self._capturing([job]) as capture:
            out = backend.model(
                input_ids=input_ids,
                use_cache=True,
                logits_to_keep=keep,
                **{_cache_keyword(backend.model): cache},
                **(self._vision_inputs(job, input_ids) if job.pixels is not None else {}),
            )
        if capture is not None:
            self._routed([job], capture, first=routing_start(job))
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

    def _vision_inputs(self, job: _Job, input_ids: torch.Tensor) -> dict[str, Any]:
        """A prompt's images and videos as the model's forward takes them, with 3-D positions (sets ``rope_delta``)."""
        backend = self.backend
        assert job.pixels is not None and backend._vision is not None
        positions, job.rope_delta = _rope_positions(backend.model, input_ids, job.pixels, backend._vision)
        return {**job.pixels.forward_inputs(backend.device, backend.model.dtype), "position_ids": positions}

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
        with self._capturing(self.rows) as capture:
            out = backend.model(
                input_ids=torch.tensor([[t] for t in self.pending], device=device),
                attention_mask=mask,
                position_ids=torch.tensor([[job.position + job.rope_delta] for job in self.rows], device=device),
                use_cache=True,
                logits_to_keep=1,
                **{_cache_keyword(backend.model): self.cache},
            )
        if capture is not None:
            self._routed(self.rows, capture)
        self.cache, self.mask = _cache_of(out), mask
        logits = out.logits[:, -1]
        ended: list[int] = []
        for i, job in enumerate(self.rows):
            job.position += 1
            self.pending[i] = self._sample(job, logits[i])
            if self._ended(job):
                ended.append(i)
        self._drop(ended)

    @contextlib.contextmanager
    def _capturing(self, jobs: list[_Job]) -> Any:
        """Hook the routers for one forward pass when one of ``jobs`` records routing; yields the capture or None."""
        capture = self.capture
        if capture is None or capture.unsupported is not None or all(job.routing is None for job in jobs):
            yield None  # nothing captured: a result asked for routing then has none (the core records it missing)
            return
        with capture:
            yield capture

    def _routed(self, jobs: list[_Job], capture: RoutingCapture, first: int = 0) -> None:
        """Give each job that records routing its rows of the pass just run (one row per job in a decoding step)."""
        rows = capture.take()
        if rows is None:
            logger.warning("transformers: routing not recorded: %s", capture.unsupported or "a router did not run")
            for job in jobs:
                job.routing = None
            return
        per_job = rows.shape[0] // len(jobs)
        shape = (int(rows.shape[1]), int(rows.shape[2]))
        for i, job in enumerate(jobs):
            if job.routing is not None:
                job.routing_shape = shape
                job.routing.append(rows[i * per_job + first : (i + 1) * per_job].numpy().astype("<i4").tobytes())

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
        if job.never is not None:  # never sampled (vision placeholders); raw logprobs stay the model's
            scaled = scaled.index_fill(0, job.never, -math.inf)
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
        if job.kept is not None:  # the kept set, and the logprob of the distribution sampled from (renormalised)
            job.kept.append(torch.isfinite(scaled).nonzero().flatten().tolist())
            source = scaled
        else:
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
