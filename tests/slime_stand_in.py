"""A stand-in for slime's ``Sample`` (slime is not on the package index), shared by the tests of the slime hook.

Its fields follow slime's source as quoted in research/rl_integrations.md §1.2 (slime 624b824a); slots make
setting a field slime lacks an AttributeError.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


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
