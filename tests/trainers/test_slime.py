"""slime (not on the package index): ``to_slime`` fills a stand-in of slime's ``Sample`` whose fields and checks
follow slime's source as quoted in research/rl_integrations.md §1.2 (slime 624b824a). The generate hook of
examples/slime is tested with the SGLang adapter (tests/sglang/test_slime.py)."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from tito_core import Trajectory
from tito_core.export import to_slime
from tito_core.trajectory import Turn, Usage

from ..slime_stand_in import Sample, check_like_slime, slime_top_p_logprobs


def _on_sample(fields: dict) -> Sample:
    """A stand-in ``Sample`` with ``fields`` set as the generate hook sets them (slots: no field slime lacks)."""
    sample = Sample()
    status = fields.pop("status")
    for name, value in fields.items():
        setattr(sample, name, value)
    sample.status = Sample.Status[status]
    return sample


def _truncating_trajectory() -> Trajectory:
    """Two truncating calls with their kept sets (vocabulary of 16), a tool result (loss 0) between them."""
    from tito_core.sampling_mask import SamplingMask

    traj = Trajectory("r1")
    traj.append("prompt", [1, 2, 3], turn=0)
    traj.append("output", [4, 5], [-0.5, -0.25], turn=0)
    traj.append("prompt", [6, 7, 8], turn=1)
    traj.append("output", [9], [-1.0], turn=1)
    masks = [SamplingMask.from_rows([[4, 11], [5, 7, 9]]), SamplingMask.from_rows([[9, 12, 3]])]
    for i, (start, plen, olen) in enumerate([(0, 3, 2), (5, 3, 1)]):
        usage = Usage(prompt_tokens=plen, completion_tokens=olen)
        turn = Turn(index=i, rid="x", prompt_start=start, prompt_len=plen, output_len=olen, finish_reason="stop",
                    stop_reason="end_turn", usage=usage, sampling_mask=masks[i])  # fmt: skip
        traj.add_turn(turn)
    traj.set_status("completed")
    return traj


def test_routed_experts_have_slimes_shape():
    traj = Trajectory("r1")
    traj.append("prompt", [1, 2, 3], turn=0)
    traj.append("output", [4, 5], [-0.5, -0.25], turn=0)
    rows = struct.pack("<24i", *range(24))  # 4 rows (tokens - 1) x 3 layers x 2 experts
    traj.add_turn(Turn(index=0, rid="x", prompt_start=0, prompt_len=3, output_len=2, finish_reason="length",
                       stop_reason="max_tokens", usage=Usage(prompt_tokens=3, completion_tokens=2),
                       routed_experts=rows, routed_experts_shape=(3, 2)))  # fmt: skip
    traj.set_status("truncated")
    sample = Sample()
    fields = to_slime(traj)
    status = fields.pop("status")
    for name, value in fields.items():
        setattr(sample, name, value)
    sample.status = Sample.Status[status]
    check_like_slime(sample, layers=3, top_k=2)
    assert sample.status is Sample.Status.TRUNCATED
    assert sample.rollout_routed_experts[3, 2].tolist() == [22, 23]


def test_kept_sets_fill_slimes_top_p_fields_which_slime_scores_over_the_kept_sets():
    """The kept sets go in slime's Sample.rollout_top_p_token_ids / _offsets, pass slime's checks, and slime's loss
    rule over them (slime_top_p_logprobs) gives each trained token the kept-set logprob tito's trainer helper gives."""
    np = pytest.importorskip("numpy")
    from tito_core.kept_logprobs import kept_logprobs

    fields = to_slime(_truncating_trajectory())
    sample = _on_sample(dict(fields))
    check_like_slime(sample)
    assert sample.rollout_top_p_token_ids == [4, 11, 5, 7, 9, 9, 12, 3]
    assert sample.rollout_top_p_token_offsets == [0, 2, 5, 5, 5, 5, 8]  # the tool result's rows empty, as slime's own
    logits = np.random.default_rng(0).normal(size=(sample.response_length, 16)).astype(np.float32)
    response = sample.tokens[-sample.response_length :]
    trained = np.array(sample.loss_mask, dtype=bool)
    rows = (fields["rollout_top_p_token_ids"], fields["rollout_top_p_token_offsets"])
    kept = np.asarray(kept_logprobs(logits, response, rows))
    slime = slime_top_p_logprobs(logits.astype(np.float64), sample)
    np.testing.assert_allclose(slime[trained], kept[trained], rtol=0, atol=1e-5)
    full = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    assert (slime[trained] - full[trained, np.array(response)[trained]] > 0.05).all()  # off by log S without the sets


def test_fields_against_the_installed_slime():
    types = pytest.importorskip(
        "slime.utils.types",
        reason="slime is not on the package index: its Sample is checked against the source quoted in "
        "research/rl_integrations.md §1.2 instead (the stand-in in tests/slime_stand_in.py)",
    )
    names = {f.name for f in dataclasses.fields(types.Sample)}
    traj = Trajectory("r1")
    traj.append("prompt", [1], turn=0)
    traj.append("output", [2], [-1.0], turn=0)
    assert set(to_slime(traj)) <= names
    fields = to_slime(_truncating_trajectory())
    assert {"rollout_top_p_token_ids", "rollout_top_p_token_offsets"} <= set(fields) <= names
