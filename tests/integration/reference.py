"""The independent scorer of the weight-update tests: a plain transformers forward pass of a checkpoint.

An engine's own re-scoring of its tokens proves that they are self-consistent, not that the engine serves the
checkpoint it was asked to load (it passes whatever the engine loaded). The forward pass here reads the
checkpoint's files with transformers, in bf16 like the engines (``--dtype bfloat16``), and gives the logprob of
each token given the tokens before it: what the weights a span names would have given, computed without the
engine. A vision-language checkpoint (a config with a ``vision_config``) is scored with its images: the
processor's ``pixel_values`` and ``image_grid_thw`` go to the forward pass with the expanded ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Reference", "mixed_checkpoint", "trainer_probe", "untied_checkpoint"]


class Reference:
    """Forward passes of checkpoints (each loaded once, bf16, CPU, eager attention)."""

    def __init__(self) -> None:
        self._models: dict[Path, Any] = {}

    def _model(self, path: str | Path) -> Any:
        key = Path(path).resolve()
        model = self._models.get(key)
        if model is None:
            import torch
            from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

            vision = getattr(AutoConfig.from_pretrained(str(key)), "vision_config", None) is not None
            auto: Any = AutoModelForImageTextToText if vision else AutoModelForCausalLM
            model = auto.from_pretrained(str(key), dtype=torch.bfloat16, attn_implementation="eager")
            model.eval()
            self._models[key] = model
        return model

    def score(self, path: str | Path, ids: Sequence[int], images: Mapping[str, Any] | None = None) -> list[float]:
        """The logprob of each of ``ids[1:]`` given the ids before it, under the checkpoint at ``path``.

        ``images``: the image processor's output for the images of ``ids`` (``pixel_values``, ``image_grid_thw``;
        numpy arrays or tensors), for a vision-language checkpoint.
        """
        import torch

        model = self._model(path)
        vision = {k: torch.as_tensor(v) for k, v in (images or {}).items()}
        if "pixel_values" in vision:
            vision["pixel_values"] = vision["pixel_values"].to(torch.bfloat16)
        with torch.inference_mode():
            x = torch.tensor([list(ids)], dtype=torch.long)
            logits = model(input_ids=x, **vision).logits[0, :-1].float()
            logprobs = logits.log_softmax(-1).gather(-1, x[0, 1:, None])[:, 0]
        return [float(v) for v in logprobs.tolist()]


def trainer_probe(reference: Reference, path: str | Path, tokenizer: Any, **kwargs: Any) -> Any:
    """A :class:`~tito_core.weights.WeightProbe` as a trainer builds it: a short text and its logprobs under the
    checkpoint at ``path``, computed by the forward pass above (not by an engine)."""
    from tito_core.weights import WeightProbe

    text = "The trainer checks the weights it pushed: one short sequence, scored by the engine and by itself."
    ids = list(tokenizer.encode(text))
    return WeightProbe(token_ids=ids, logprobs=reference.score(path, ids), **kwargs)


def mixed_checkpoint(base: str | Path, other: str | Path, prefix: str, out: str | Path) -> Path:
    """A half-loaded checkpoint: ``base``'s files with the tensors whose names start with ``prefix`` from
    ``other`` (what an engine serves when one layer of an update did not arrive). Written once to ``out``."""
    import shutil

    from safetensors.torch import load_file, save_file

    target = Path(out)
    if (target / "model.safetensors").is_file():
        return target
    shutil.copytree(base, target, dirs_exist_ok=True)
    tensors = load_file(str(Path(base) / "model.safetensors"))
    replaced = load_file(str(Path(other) / "model.safetensors"))
    swapped = [name for name in tensors if name.startswith(prefix)]
    assert swapped, f"no tensor of {base} starts with {prefix!r}"
    tensors.update({name: replaced[name] for name in swapped})
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


def untied_checkpoint(base: str | Path, out: str | Path) -> Path:
    """``base`` (a checkpoint with tied embeddings) with its output layer written out: ``tie_word_embeddings``
    false and ``lm_head.weight`` a copy of the embedding matrix. The same function, other files: what vLLM 0.32's
    CPU build needs to reload it from disk (see ``tests/integration/vllm/test_weight_reload.py``)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    target = Path(out)
    if (target / "model.safetensors").is_file():
        return target
    shutil.copytree(base, target, dirs_exist_ok=True)
    config = json.loads((target / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (target / "config.json").write_text(json.dumps(config, indent=2))
    tensors = load_file(str(Path(base) / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target
