"""The train demo's policy-gradient step on the tiny random Qwen3 with a LoRA adapter (run by `nox -s train_demo`).

The demo's own CI run is short and its rollouts may give no group a reward spread, so the step is checked
here on constructed rollouts: the grouped forward (shared prompt run once) gives the same logprobs as one
forward pass per sequence, only loss-mask tokens are scored, and a step moves the adapter exactly when some
advantage is non-zero.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train_reinforce as demo  # noqa: E402

PROMPT = [9707, 1052, 11, 1246, 525, 498, 30, 151645, 198]


@pytest.fixture(scope="module")
def policy() -> Any:
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from tito_testing.tiny_model import build_tiny_qwen3

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(build_tiny_qwen3(), dtype=torch.float32)
    model = get_peft_model(base, demo_lora())
    with torch.no_grad():  # LoRA's B starts at 0: make the adapter matter, so a wrong path would show
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    return model


def demo_lora() -> Any:
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])


def rollouts(advantages: list[float]) -> list[demo.Rollout]:
    """A group sharing PROMPT: output, then a tool result (mask 0), then output again; lengths differ."""
    made = []
    for i, advantage in enumerate(advantages):
        first = [100 + i, 200 + i, 151645]
        tool = [151644, 872, 198, 17 + i]
        second = [300 + i] * (i + 1) + [151645]
        ids = PROMPT + first + tool + second
        mask = [0] * len(PROMPT) + [1] * len(first) + [0] * len(tool) + [1] * len(second)
        made.append(demo.Rollout(ids, mask, advantage, group=0))
    return made


@pytest.mark.parametrize("adapter", [True, False], ids=["lora", "full fine-tuning"])
def test_the_grouped_forward_scores_each_loss_token_as_a_full_forward_does(policy: Any, adapter: bool) -> None:
    """With a LoRA adapter, and on a plain model (every weight trained: benchmarks/train_ab.py --lora-rank 0)."""
    if not adapter:
        from transformers import AutoModelForCausalLM

        from tito_testing.tiny_model import build_tiny_qwen3

        policy = AutoModelForCausalLM.from_pretrained(build_tiny_qwen3(), dtype=torch.float32)
    group = rollouts([1.0, -1.0, 0.5])
    policy.eval()
    with torch.no_grad():
        grouped = demo.group_token_logprobs(policy, group)
        for rollout, logps in zip(group, grouped, strict=True):
            ids = torch.tensor([rollout.token_ids])
            full = torch.log_softmax(policy(ids).logits[0, :-1].float(), -1).gather(1, ids[0, 1:, None])[:, 0]
            scored = torch.tensor(rollout.loss_mask[1:]).bool()
            assert len(logps) == sum(rollout.loss_mask)
            assert torch.allclose(full[scored], logps, atol=1e-4)


def test_a_step_moves_the_adapter_only_with_a_non_zero_advantage(policy: Any) -> None:
    trainable = [p for p in policy.parameters() if p.requires_grad]
    base = [p for p in policy.parameters() if not p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2, weight_decay=0.0)
    before = [p.detach().clone() for p in trainable]
    frozen = [p.detach().clone() for p in base[:3]]

    flat = demo.reinforce_step(policy, optimizer, rollouts([0.0, 0.0, 0.0]), max_grad_norm=1.0)
    assert (flat.groups, flat.signal_tokens, flat.loss) == (0, 0, 0.0)
    assert all(torch.equal(a, b) for a, b in zip(before, trainable, strict=True))

    group = rollouts([1.0, -1.0, 0.0])
    stats = demo.reinforce_step(policy, optimizer, group, max_grad_norm=1.0)
    assert stats.groups == 1 and math.isfinite(stats.loss) and stats.grad_norm > 0
    assert stats.loss_tokens == sum(sum(r.loss_mask) for r in group)
    assert stats.signal_tokens == sum(sum(r.loss_mask) for r in group[:2])  # the zero-advantage one is not run
    assert any(not torch.equal(a, b) for a, b in zip(before, trainable, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(frozen, base[:3], strict=True))  # only LoRA weights train
    assert not policy.training  # back in eval mode for the next round's generation


def test_failed_and_aborted_records_are_skipped_and_forced_turns_can_be_masked() -> None:
    from tito_core import Trajectory
    from tito_core.runner import RolloutRecord, Timings, TokenCounts

    traj = Trajectory("t:0")
    traj.append("prompt", PROMPT, turn=0)
    traj.append("output", [100, 151645], logprobs=[-0.1, -0.2], turn=0)
    traj.add_turn(_turn(0, prompt_start=0, prompt_len=len(PROMPT), output_len=2, constrained=True))
    traj.append("prompt", [151644, 872, 198], turn=1)
    traj.append("output", [300, 151645], logprobs=[-0.3, -0.4], turn=1)
    traj.add_turn(_turn(1, prompt_start=len(PROMPT) + 2, prompt_len=3, output_len=2, constrained=False))
    traj.close("completed")

    def record(status: str, sample: int) -> RolloutRecord:
        return RolloutRecord(
            task_id="t", sample=sample, group=0, status=status, status_reason=None, reward=1.0, advantage=0.5,  # type: ignore[arg-type]
            trajectory=traj.to_record(), timings=Timings(started=0.0, wall_s=0.0, agent_s=0.0),
            tokens=TokenCounts(total=len(traj), output=4, prompt=len(traj) - 4, model_calls=2, tool_calls=1),
        )  # fmt: skip

    records = [record("completed", 0), record("truncated", 1), record("failed", 2), record("aborted", 3)]
    kept, skipped = demo.usable_rollouts(records, mask_forced=False)
    assert len(kept) == 2 and skipped == {"failed": 1, "aborted": 1}
    assert kept[0].loss_mask == traj.loss_mask and sum(kept[0].loss_mask) == 4
    masked, _ = demo.usable_rollouts(records[:1], mask_forced=True)
    assert sum(masked[0].loss_mask) == 2 and masked[0].loss_mask[-2:] == [1, 1]


def _turn(index: int, *, prompt_start: int, prompt_len: int, output_len: int, constrained: bool) -> Any:
    from tito_core.trajectory import Turn, Usage

    usage = Usage(prompt_tokens=prompt_len, completion_tokens=output_len)
    return Turn(
        index=index, rid=f"r{index}", prompt_start=prompt_start, prompt_len=prompt_len, output_len=output_len,
        finish_reason="stop", stop_reason="end_turn", usage=usage, constrained=constrained,
    )  # fmt: skip
