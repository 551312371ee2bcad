"""A stand-in for slime's ``Sample`` (slime is not on the package index), the invariants slime checks on it, and
the loader of the slime example, shared by the tests of the export and of the hook.

Its fields follow slime's source as quoted in research/rl_integrations.md §1.2 (slime 624b824a); slots make
setting a field slime lacks an AttributeError.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
from itertools import pairwise
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "slime" / "generate_with_tito.py"


@dataclasses.dataclass(slots=True)
class Sample:
    """slime.utils.types.Sample's fields (slots: setting a field slime lacks raises AttributeError)."""

    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    prompt: str = ""
    tokens: list[int] = dataclasses.field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None  # raw: {"images": [...]} (slime/utils/types.py, 624b824a)
    multimodal_train_inputs: dict[str, Any] | None = None  # processed: pixel_values, image_grid_thw (tensors)
    multimodal_train_input_id: str | None = None
    response: str = ""
    response_length: int = 0
    reward: float | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    rollout_routed_experts: Any = None
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    teacher_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    rollout_id: str | None = None
    session_id: str | None = None
    weight_versions: list[str] = dataclasses.field(default_factory=list)
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    train_metadata: dict[str, Any] | None = None
    remove_sample: bool = False
    generate_function_path: str | None = None


def check_like_slime(sample: Sample, *, layers: int | None = None, top_k: int | None = None) -> None:
    """The invariants slime asserts on a generated sample before training."""
    assert isinstance(sample.status, Sample.Status)
    # slime/ray/rollout.py: loss_mask covers the response; _validate_response_metadata_lengths: so do logprobs
    assert len(sample.loss_mask) == sample.response_length == len(sample.rollout_log_probs)
    assert 0 < sample.response_length < len(sample.tokens)
    assert set(sample.loss_mask) <= {0, 1}
    # tool and environment tokens carry logprob 0.0
    assert all(lp == 0.0 for lp, m in zip(sample.rollout_log_probs, sample.loss_mask, strict=True) if not m)
    assert sample.rollout_id
    if layers is not None:
        # rollout_data_utils.validate_rollout_routed_experts_for_replay: (len(tokens) - 1, layers, top_k) int32
        assert sample.rollout_routed_experts.shape == (len(sample.tokens) - 1, layers, top_k)
        assert str(sample.rollout_routed_experts.dtype) == "int32"
    # top-p replay (types.Sample._validate_response_metadata_lengths; ray/rollout.py when rollout_top_p != 1.0):
    # both fields or neither, response_length + 1 offsets from 0 that end at the number of ids
    ids, offsets = sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets
    assert (ids is None) == (offsets is None)
    if offsets is not None:
        assert len(offsets) == sample.response_length + 1 and offsets[0] == 0 and offsets[-1] == len(ids)
        assert all(a <= b for a, b in pairwise(offsets))


def slime_top_p_logprobs(logits: Any, sample: Sample) -> Any:
    """The response's logprobs as slime's loss computes them over ``rollout_top_p_token_ids`` (slime 624b824a).

    ``logits`` are ``(response_length, vocab)``, row ``i`` predicting response token ``i``. slime's rule
    (backends/megatron_utils/loss.py ``_fill_topp_mask_rows``, utils/ppo_utils.py ``_VocabParallelLogProbEntropy``):
    each response row keeps only its recorded ids, the sampled token's logit is put back whatever the row holds,
    and the log-softmax runs over what is kept. An empty row so keeps the sampled token alone: log-probability 0.
    """
    import numpy as np

    ids, offsets = sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets
    response = sample.tokens[len(sample.tokens) - sample.response_length :]
    keep = np.zeros(logits.shape, dtype=bool)
    for i, token in enumerate(response):
        keep[i, ids[offsets[i] : offsets[i + 1]]] = True
        keep[i, token] = True
    masked = np.where(keep, logits, -np.inf)
    top = masked.max(axis=-1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(masked - top).sum(axis=-1))
    return masked[np.arange(len(response)), response] - log_z


def load_slime_example(monkeypatch: Any, backend: Any, tokenizer: Any) -> Any:
    """examples/slime/generate_with_tito.py as a module, on ``backend`` and ``tokenizer`` instead of slime's."""
    spec = importlib.util.spec_from_file_location("generate_with_tito", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "backend_from_slime_args", lambda args: backend)
    monkeypatch.setattr(module, "tokenizer_for", lambda path: tokenizer)
    return module
