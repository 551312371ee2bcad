"""The A/B on an inference engine: rollouts sampled by an SGLang server, the trainer's weights pushed to it each step.

The trainer runs in the A/B's process (``--device``); the server serves ``--model-dir`` (started by you, see
docs/training-ab.md). Every step, the trainer writes its weights to a folder (one safetensors file, bf16, a LoRA
adapter merged in) and the server loads them with ``/update_weights_from_disk`` inside
:func:`tito_core.weight_update`: the server is paused, loads, is labelled with the weights' version (the trainer's
step), and must score a short probe sequence like the trainer before it samples again (:class:`tito_core.WeightProbe`;
a server that did not load them is left paused and the run stops). With ``--staleness K`` the server is kept ``K``
versions behind the trainer: step ``t`` samples with the weights of step ``t - 1 - K``.

SGLang 0.5.23 also has ``/update_weights_from_tensor`` (tensors serialized by its own ``MultiprocessingSerializer``:
CUDA IPC handles, so the trainer must import SGLang and share the server's GPU) and ``/update_weights_from_distributed``
(an NCCL group); the disk route needs neither and runs on the CPU build too.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

PROBE_TEXT = "The trainer scores this short, ordinary sentence itself, and so must the engine after every push."


def engine_config(
    config: dict[str, Any], url: str, model_dir: str, *, thinking: bool = True, timeout: float = 900.0
) -> dict[str, Any]:
    """The runner's config sampling on the SGLang server at ``url``, with the model's own chat template.

    ``config`` is the demo's (embedded backend, SmolLM2's tool template); the tools, reward and limits stay.
    ``thinking``: the template's ``enable_thinking`` (Qwen3's renders the reasoning of the turns after the last user
    question and drops it from earlier ones; tito keeps the tokens the model generated either way).
    """
    kept = {k: v for k, v in config.items() if k not in ("chat_template", "backend_options")}
    return {
        **kept,
        "backend": "sglang",
        "backend_options": {"base_url": url, "timeout": timeout},
        "tokenizer": model_dir,
        "chat_template_kwargs": {"enable_thinking": thinking},
    }


def served_version(step: int, staleness: int) -> int:
    """The weights (the trainer's step that made them; 0: the initial ones) that sample step ``step`` (1-based)."""
    return max(0, step - 1 - staleness)


def merged_state_dict(model: Any) -> dict[str, Any]:
    """The model's weights as the base architecture names them, a LoRA adapter's delta added (the model untouched)."""
    if not hasattr(model, "get_base_model"):
        return dict(model.state_dict())
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    state = {k.replace(".base_layer.", "."): v for k, v in base.state_dict().items() if "lora_" not in k}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            for adapter in module.active_adapters:
                delta = module.get_delta_weight(adapter)  # type: ignore[attr-defined]  # on each LoRA layer type
                state[f"{name}.weight"] = state[f"{name}.weight"] + delta
    return state


def save_weights(model: Any, folder: Path, model_dir: str | os.PathLike[str], *, dtype: str = "bfloat16") -> Path:
    """Write ``model``'s weights to ``folder`` as one ``model.safetensors`` (``dtype``) beside ``model_dir``'s config.

    A tied output layer is left out, as the checkpoints of tied models leave it. The file is written under another
    name and renamed, so a reader never sees half of it.
    """
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    with torch.no_grad():
        tensors = {
            name: value.detach().to("cpu", getattr(torch, dtype), copy=True).contiguous()
            for name, value in merged_state_dict(model).items()
            if not (tied and name == "lm_head.weight")
        }
    partial = folder / "model.safetensors.partial"
    save_file(tensors, str(partial), metadata={"format": "pt"})
    os.replace(partial, folder / "model.safetensors")
    for name in ("config.json", "generation_config.json"):
        if (Path(model_dir) / name).is_file():
            shutil.copyfile(Path(model_dir) / name, folder / name)
    return folder


def probe_logprobs(model: Any, ids: list[int]) -> list[float]:
    """The trainer's logprob of each of ``ids[1:]`` (float32, temperature 1): a :class:`tito_core.WeightProbe`'s."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        tensor = torch.tensor([ids], device=device)
        logits = model(input_ids=tensor).logits[0, :-1].float()
        picked = logits.log_softmax(-1).gather(-1, tensor[0, 1:, None])[:, 0]
    return [float(v) for v in picked.tolist()]


async def load_from_disk(url: str, folder: str | os.PathLike[str], timeout: float = 900.0) -> None:
    """Have the SGLang server at ``url`` load the weights in ``folder`` (``/update_weights_from_disk``).

    Raises:
        SystemExit: The server refused or failed the load (its answer is in the message).
    """
    import aiohttp

    body = {"model_path": str(folder), "flush_cache": True, "abort_all_requests": False}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
        session.post(f"{url.rstrip('/')}/update_weights_from_disk", json=body) as answer,
    ):
        text = await answer.text()
        try:
            success = answer.status == 200 and bool((await answer.json(content_type=None)).get("success"))
        except ValueError:
            success = False
    if not success:
        raise SystemExit(f"{url} did not load the weights from {folder} (/update_weights_from_disk answered "
                         f"{answer.status}: {text[:500]})")  # fmt: skip


class Engine:
    """One SGLang server an arm samples on, kept at the trainer's weights (``staleness`` versions behind)."""

    def __init__(self, url: str, model_dir: str, folder: Path, *, staleness: int = 0, tolerance: float = 0.05) -> None:
        from tito_core import get_backend
        from tito_core.tokenizers import load_tokenizer

        self.url, self.model_dir, self.folder = url, model_dir, folder
        self.staleness, self.tolerance = staleness, tolerance
        self.backend = get_backend("sglang", base_url=url, timeout=900.0)
        self.probe_ids = list(load_tokenizer(model_dir).encode(PROBE_TEXT))
        self.saved: dict[int, tuple[Path, list[float]]] = {}  # version -> its folder and the trainer's probe
        self.served = 0

    def _probe(self, logprobs: list[float]) -> Any:
        from tito_core import WeightProbe

        return WeightProbe(token_ids=self.probe_ids, logprobs=logprobs, tolerance=self.tolerance)

    async def start(self, model: Any) -> dict[str, Any]:
        """Load ``model_dir`` as version 0 (the server may hold another arm's weights).

        The probe then says the server serves the trainer's initial model.
        """
        self.saved[0] = (Path(self.model_dir), probe_logprobs(model, self.probe_ids))
        self.served = -1  # nothing of this arm's yet
        return await self._push(0)

    async def after_step(self, model: Any, step: int) -> dict[str, Any] | None:
        """Save the weights of ``step``; push the version the next step samples with, when it changed."""
        folder = save_weights(model, self.folder / f"v{step}", self.model_dir)
        self.saved[step] = (folder, probe_logprobs(model, self.probe_ids))
        target = served_version(step + 1, self.staleness)
        push = await self._push(target) if target != self.served else None
        for version in [v for v in self.saved if 0 < v < target]:  # no later step samples with them
            shutil.rmtree(self.saved[version][0], ignore_errors=True)
        return push

    async def _push(self, version: int) -> dict[str, Any]:
        """Load ``version`` in :func:`tito_core.weight_update` (paused, labelled, probed); what the probe measured.

        ``engine_vs_pushed``: mean |engine - trainer| over the probe under the pushed weights; ``pushed_vs_previous``:
        how far those weights moved the trainer's own probe logprobs from the ones served before (the push is seen
        when the first is well below the second).
        """
        from tito_core import weight_update

        folder, logprobs = self.saved[version]
        previous = self.saved.get(self.served)
        t0 = time.perf_counter()
        async with weight_update([self.backend], version=version, mode="recompute", probe=self._probe(logprobs)) as up:
            await load_from_disk(self.url, folder)
        (score,) = up.probes
        self.served = version
        moved = None if previous is None else sum(abs(a - b) for a, b in zip(logprobs, previous[1], strict=True))
        return {
            "version": version,
            "engine_vs_pushed": score.mean_diff,
            "engine_vs_pushed_max": score.max_diff,
            "pushed_vs_previous": None if moved is None else moved / len(logprobs),
            "seconds": time.perf_counter() - t0,
        }

    async def close(self) -> None:
        """Close the backend's connections (the server keeps the last weights pushed)."""
        await self.backend.aclose()


def first_sample_reward(sample: Any) -> float:
    """1 for the first rollout of each group, 0 for the others: a reward spread in every group of two or more.

    So every step has a gradient whatever the model writes: for smoke tests of the plumbing (a random model), not
    learning.
    """
    return 1.0 if sample.sample == 0 else 0.0
