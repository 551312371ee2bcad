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

from ..slime_stand_in import Sample, check_like_slime


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
