"""The exports: a :class:`~tito_core.trajectory.Trajectory` as the fields each RL trainer expects, one module each.

Every exporter returns plain Python data (no trainer is imported). The *response* is everything after
the prompt: the model's outputs (loss 1) and the tool results / boundaries between them (loss 0).
Logprobs of non-output tokens are ``0.0``, as the trainers expect.

A rollout is a tree of branches (its lineages): :func:`training_branches` makes one training sample per leaf
(:mod:`~tito_core.export.branches`), and every exporter takes a trajectory or one :class:`TrainingBranch`.

Weight versions (:mod:`tito_core.versions`) go in the trainer's own field where it has one, else in a documented
extra field (docs/exports.md); a sample whose tokens have no versions (the backend reported none) exports none.

Images (docs/multimodal.md, "Trainer fields") go in each trainer's own field, every image of the sample's ids in
token order, as PIL images (``images="pil"``) or their sha256 (``"sha256"``, for rows written to a file); a
text-only sample's fields are unchanged. Pixel inputs need the model's image processor, which the caller gives.

Modules, one job each (their public names are importable from here):

* :mod:`~tito_core.export.branches`: a rollout's branches as training samples;
* :mod:`~tito_core.export.slime`, :mod:`~tito_core.export.verl`, :mod:`~tito_core.export.trl`,
  :mod:`~tito_core.export.agentlightning`, :mod:`~tito_core.export.areal`: one trainer's format each;
* :mod:`~tito_core.export.tree`: rows packed into prefix trees, each shared prefix once (AReaL's tree training);
* :mod:`~tito_core.export.media`: a sample's images and videos in the forms trainers take;
* :mod:`~tito_core.export.kept_sets`: a sample's sampling masks (kept sets), in tito's layout (verl, TRL) and in
  slime's own fields.

Running rollouts inside a trainer (TRL's ``rollout_func``, verl's agent loop, slime's generate hook, Agent
Lightning's runner) is :mod:`tito_core.trainers`'; it uses these.
"""

from __future__ import annotations

from .agentlightning import model_request_events
from .areal import to_areal
from .branches import BranchReward, TrainingBranch, superseded_branches, training_branches
from .kept_sets import KeptSetLayout
from .slime import to_slime
from .tree import PackedTree, TreeNode, pack_trees
from .trl import to_trl
from .verl import VERL_METRICS, to_verl, turn_token_scores, verl_multi_modal_inputs

__all__ = [
    "VERL_METRICS",
    "BranchReward",
    "KeptSetLayout",
    "PackedTree",
    "TrainingBranch",
    "TreeNode",
    "model_request_events",
    "pack_trees",
    "superseded_branches",
    "to_areal",
    "to_slime",
    "to_trl",
    "to_verl",
    "training_branches",
    "turn_token_scores",
    "verl_multi_modal_inputs",
]
