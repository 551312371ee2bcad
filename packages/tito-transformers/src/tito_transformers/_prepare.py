"""Request preparation for the embedded backend: check a request against the model, fill its job's settings.

:class:`_Preparer` runs on the caller's thread, before a request is queued. It owns what that needs to know
about the model -- the vocabulary size, the context window, the ``generation_config`` sampling defaults and
EOS ids -- and the two things built on first use: the tokenizer (for stop strings and grammars) and the
xgrammar compiler (with its compiled-grammar cache).
"""

from __future__ import annotations

import re
import secrets
import threading
from typing import TYPE_CHECKING, Any

from tito_core.backend import GenerateRequest, SamplingParams
from tito_core.errors import BackendRequestError, ContextLengthError

from ._job import _Job

if TYPE_CHECKING:
    import torch

_XGRAMMAR_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")  # "[11:05:54] /project/cpp/grammar_parser.cc:820: "


class _Preparer:
    """Checks requests for one model and gives each job its sampling fields and grammar matcher (thread-safe)."""

    def __init__(
        self,
        name: str,
        model_path: str,
        device: torch.device,
        vocab: int,
        context: int | None,
        defaults: dict[str, Any],
        eos_token_ids: frozenset[int],
    ) -> None:
        self.name = name  # the backend's, for its errors
        self.model_path = model_path
        self.device = device
        self.vocab = vocab
        self.context = context
        self.defaults = defaults
        self.eos_token_ids = eos_token_ids
        self.tokenizer: Any = None
        self._compiler: Any = None  # xgrammar.GrammarCompiler, built on the first constrained request
        self._compiler_lock = threading.Lock()

    def prepare(self, job: _Job) -> tuple[str, str] | None:
        """Check the request and fill the job's sampling fields; returns its constraint ``(field, text)``, if any."""
        import torch

        request, sampling = job.request, job.request.sampling
        if not job.input_ids:
            raise ValueError("input_ids is empty: the transformers backend needs at least one prompt token")
        if not 0 <= request.prefix_len <= len(job.input_ids):
            raise ValueError(f"prefix_len {request.prefix_len} is outside the prompt (length {len(job.input_ids)})")
        bad = [i for i in job.input_ids if not 0 <= i < self.vocab]
        if bad:
            raise ValueError(f"input id {bad[0]} is outside the model's vocabulary (size {self.vocab})")
        never = sorted({int(i) for i in request.never_sample})
        if never and not 0 <= never[0] <= never[-1] < self.vocab:
            raise ValueError(f"never_sample ids {never} are not all in the model's vocabulary (size {self.vocab})")
        if never:
            job.never = torch.tensor(never, device=self.device)
        constraint = self._constraint(request)
        room = (self.context - len(job.input_ids)) if self.context else None
        if room is not None and room <= 0:
            raise ContextLengthError(
                f"prompt of {len(job.input_ids)} tokens does not fit the context window of {self.context}",
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

    def constrain(self, job: _Job, field: str, text: str) -> None:
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
        job.bitmask = xgrammar.allocate_token_bitmask(1, self.vocab)

    def _grammar_compiler(self) -> Any:
        """The xgrammar compiler for this model's vocabulary, built once (thread-safe)."""
        with self._compiler_lock:
            if self._compiler is None:
                import xgrammar

                self._load_tokenizer()
                info = xgrammar.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab, stop_token_ids=sorted(self.eos_token_ids) or None
                )
                self._compiler = xgrammar.GrammarCompiler(info)
            return self._compiler

    def _pick(self, sampling: SamplingParams, field: str, default: float) -> float:
        value = getattr(sampling, field)
        if value is None:
            value = self.defaults.get(field, default)
        return float(value)

    def _load_tokenizer(self) -> None:
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            try:
                self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            except (OSError, ValueError) as exc:
                raise ValueError(f"stop strings and grammars need the model's tokenizer, which failed: {exc}") from exc
