"""Mixture-of-experts routing of a Hugging Face model: the experts each token went to, captured and replayed.

A model's routers are the modules its own ``_can_record_outputs["router_logits"]`` names (how transformers records
router logits, for every MoE family). Routing can be captured from the routers that choose the experts
themselves and return ``(router_logits, gate_weights, expert_ids)``, the form of Qwen3-MoE's ``Qwen3MoeTopKRouter``
(Qwen2-MoE, Mixtral, OLMoE and others share it): :class:`RoutingCapture` reads ``expert_ids`` (tokens x top_k)
of every router call with forward hooks. Rows are ``layers x top_k`` int32 with one entry per router, in layer
order (every layer of Qwen3-MoE; the sparse layers only where a model mixes dense ones in).

:func:`replay_routing` is the trainer's side (routing replay, R3): in its block, each router's choice is replaced by
recorded expert ids, and the gate weights are recomputed from the router's own logits over those experts as
Qwen3-MoE computes them: softmax over all experts in float32, the recorded experts' probabilities, renormalised to
sum 1 when the router's ``norm_topk_prob`` is set, in the logits' dtype. The weights keep their graph, so a trainer
that replays still trains the router.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["RoutingCapture", "expert_ids", "replay_routing", "routers"]


def routers(model: Any) -> tuple[Any, ...]:
    """The router modules of ``model`` in layer order; empty for a model without MoE layers.

    A router is a module of the class the model's ``_can_record_outputs["router_logits"]`` names (and, when that
    recorder names a layer, under that name). Works on a wrapped model too (a ``peft`` model): every submodule's
    declaration is read.
    """
    wanted: list[tuple[type, str | None]] = []
    for module in model.modules():
        recorder = (getattr(type(module), "_can_record_outputs", None) or {}).get("router_logits")
        if recorder is None:
            continue
        target = recorder if isinstance(recorder, type) else getattr(recorder, "target_class", None)
        if isinstance(target, type):
            wanted.append((target, None if isinstance(recorder, type) else getattr(recorder, "layer_name", None)))
    if not wanted:
        return ()
    return tuple(
        module
        for name, module in model.named_modules()
        if any(isinstance(module, cls) and (layer is None or layer in name) for cls, layer in wanted)
    )


class RoutingCapture:
    """Forward hooks on routers that record the expert ids each forward pass chose (one thread; a context manager).

    ``with capture:`` hooks the routers for one forward pass (and unhooks them after); :meth:`take` then returns that
    pass's routing. A router whose output is not ``(..., expert_ids)`` cannot be captured: :attr:`unsupported` says
    why, and :meth:`take` returns None.
    """

    def __init__(self, modules: Sequence[Any]) -> None:
        if not modules:
            raise ValueError("no routers to capture: the model has no MoE layers")
        self._layers = {id(module): index for index, module in enumerate(modules)}
        self._modules = tuple(modules)
        self._handles: list[Any] = []
        self._calls: list[list[torch.Tensor]] = [[] for _ in modules]
        self.unsupported: str | None = None

    def __enter__(self) -> RoutingCapture:
        self._calls = [[] for _ in self._modules]
        self._handles = [module.register_forward_hook(self._record) for module in self._modules]
        return self

    def __exit__(self, *exc_info: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _record(self, module: Any, args: Any, output: Any) -> None:
        ids = output[-1] if isinstance(output, tuple) and output else None
        if ids is None or ids.dtype.is_floating_point or ids.dim() != 2:
            self.unsupported = f"{type(module).__name__} does not return its expert ids (tokens x top_k) last"
            return
        self._calls[self._layers[id(module)]].append(ids)

    def take(self) -> torch.Tensor | None:
        """The last pass's expert ids, ``(tokens, layers, top_k)`` int32 on the CPU (tokens in batch-major order).

        None when a router could not be captured (:attr:`unsupported`) or a router did not run exactly once.
        """
        import torch

        calls, self._calls = self._calls, [[] for _ in self._modules]
        if self.unsupported is not None or any(len(c) != 1 for c in calls):
            return None
        return torch.stack([c[0] for c in calls], dim=1).to(device="cpu", dtype=torch.int32)


@contextlib.contextmanager
def replay_routing(model: Any, experts: Any) -> Iterator[None]:
    """Inside the block, ``model``'s forward passes route each token to the recorded ``experts``.

    ``experts``: the expert ids of every token the next forward pass feeds, ``(tokens, layers, top_k)`` ints (numpy,
    torch or nested lists; tokens in batch-major order). A recorded sequence of N tokens has N - 1 rows
    (:meth:`tito_core.trajectory.Trajectory.routed_experts`, verl's ``routed_experts``, slime's
    ``rollout_routed_experts``): feed its ``ids[:-1]``. Each forward pass in the block must feed exactly ``tokens``
    tokens.

    Raises:
        ValueError: The model has no routers, or ``experts`` does not fit them (its layers, top-k, or expert ids out
            of range); a forward pass in the block feeds another number of tokens.
        NotImplementedError: A router whose gate weights this cannot recompute (not a Qwen-MoE ``norm_topk_prob``
            router).

    """
    modules = routers(model)
    if not modules:
        raise ValueError(f"{type(model).__name__} has no MoE routers: there is no routing to replay")
    for module in modules:
        if not hasattr(module, "norm_topk_prob") or not hasattr(module, "top_k"):
            raise NotImplementedError(
                f"replay recomputes gate weights as Qwen-MoE routers do (softmax, top-k, `norm_topk_prob`); "
                f"{type(module).__name__} is not one"
            )
    table = expert_ids(experts)
    _check_table(table, modules)
    handles = []
    for layer, module in enumerate(modules):
        ids = table[:, layer].to(module.weight.device)
        handles.append(module.register_forward_hook(_replacer(ids)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def expert_ids(experts: Any) -> torch.Tensor:
    """``experts`` (numpy, torch or nested lists of ints) as an int64 tensor, copied (a read-only buffer is fine)."""
    import numpy
    import torch

    if isinstance(experts, torch.Tensor):
        return experts.to(torch.long)
    return torch.from_numpy(numpy.array(experts, dtype=numpy.int64))


def _check_table(table: torch.Tensor, modules: Sequence[Any]) -> None:
    top_k = {int(module.top_k) for module in modules}
    if table.dim() != 3 or table.shape[1] != len(modules) or {int(table.shape[2])} != top_k:
        raise ValueError(
            f"recorded experts of shape {tuple(table.shape)} do not fit the model's routers: "
            f"(tokens, {len(modules)} layers, top_k {sorted(top_k)}) expected"
        )
    experts = min(int(module.num_experts) for module in modules)
    if table.numel() and (int(table.min()) < 0 or int(table.max()) >= experts):
        raise ValueError(f"recorded expert ids must be in [0, {experts}), got [{int(table.min())}, {int(table.max())}]")


def _replacer(ids: torch.Tensor) -> Any:
    """A router forward hook returning the recorded ``ids`` and gate weights recomputed over them."""
    import torch

    def hook(module: Any, args: Any, output: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = output[0]
        if logits.shape[0] != ids.shape[0]:
            raise ValueError(
                f"the forward pass feeds {logits.shape[0]} tokens but {ids.shape[0]} rows of experts were recorded"
            )
        weights = torch.softmax(logits, dim=-1, dtype=torch.float).gather(1, ids)
        if module.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights.to(logits.dtype), ids

    return hook
