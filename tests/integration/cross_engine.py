"""Same tiny model, same greedy prompt: vLLM and SGLang must produce the same output ids, but for near-ties.

Each real-server suite records its greedy ids under the tito cache; whichever suite runs second (with
the byte-identical tiny model) compares against the other's record. A scenario that runs on several engines
(tests/integration/image_scenario.py: the vLLM and SGLang suites and the embedded backend) records whole
trajectories, ids and loss mask (:func:`write_ids`, :func:`compare_ids`).

Where two engines' greedy ids part, the two tokens must be a near-tie under a plain bf16 forward pass of the
checkpoint (:func:`near_tie`): the engines' bf16 kernels round differently, and how depends on the CPU (its
instruction set picks the kernels), so which of two near-tied tokens an engine picks is not the same on every
machine. A gap beyond bf16 noise is a real difference: an engine serving other weights or another prompt.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from tito_core.backend import Backend, GenerateRequest, SamplingParams
from tito_testing.tokenizers import cache_root

ENGINES = ("vllm", "sglang")
MESSAGES = [{"role": "user", "content": "Name three prime numbers, then explain why they are prime."}]
NEW_TOKENS = 24


def required(engine: str, why: str) -> None:
    """Fail when ``engine`` is named in ``TITO_CROSS_ENGINE_REQUIRE`` (comma-separated) and its record is missing:
    in CI its suite ran first, so a comparison skipped for want of its record would be a check never made."""
    if engine in os.environ.get("TITO_CROSS_ENGINE_REQUIRE", "").split(","):
        raise AssertionError(f"{why}, and TITO_CROSS_ENGINE_REQUIRE asks for the comparison with {engine}")


def _model_digest(model_dir: Path) -> str:
    digest = hashlib.sha256()
    for name in ("model.safetensors", "config.json"):
        digest.update((model_dir / name).read_bytes())
    return digest.hexdigest()


async def greedy_ids(backend: Backend, tokenizer: Any) -> tuple[list[int], list[int]]:
    """The prompt ids and the greedy output ids for the shared prompt."""
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    prompt = [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
    request = GenerateRequest(
        rid=f"cross-{uuid.uuid4().hex}",
        input_ids=prompt,
        prefix_len=0,
        sampling=SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True),
    )
    result = await backend.generate(request)
    return prompt, list(result.output_ids)


def record_and_compare(engine: str, model_dir: Path, prompt: list[int], output: list[int]) -> str | None:
    """Record this engine's greedy ids for the shared prompt; compare them with the other server's record.

    Returns None when compared (an AssertionError is raised where the ids part at a token that is not a near-tie:
    :func:`near_ties`), else why no comparison was possible.
    """
    ids, mask = [*prompt, *output], [0] * len(prompt) + [1] * len(output)
    write_ids(engine, model_dir, "greedy", ids, mask)
    compared, missing, differences = compare_ids(engine, model_dir, "greedy", ids, mask, engines=ENGINES)
    near_ties(differences, near_tie(model_dir, ids), "greedy")
    return None if compared else "; ".join(missing) + " (the other suite has not run on this machine)"


# -- trajectories: every engine that runs a scenario records its ids and loss mask --------------------------------

ALL_ENGINES = (*ENGINES, "transformers")  # the embedded backend (tests/transformers) compares with the servers


def _record_path(engine: str, case: str) -> Path:
    return cache_root() / "cross-engine" / f"{engine}-{case}.json"


def write_ids(engine: str, model_dir: Path, case: str, ids: list[int], mask: list[int]) -> None:
    """Record ``engine``'s trajectory of scenario ``case``: its ids and loss mask (1 = the engine's output)."""
    path = _record_path(engine, case)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, {"model": _model_digest(model_dir), "ids": ids, "mask": mask})


def _write_atomically(path: Path, record: dict[str, Any]) -> None:
    """Write a record whole or not at all: suites in parallel lanes read each other's records."""
    staging = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    staging.write_text(json.dumps(record))
    staging.replace(path)


class Difference(NamedTuple):
    """Where ``engine``'s trajectory first differs from ``other``'s: both hold the same ids before ``position``,
    and ``position`` is an output token of both (a prompt difference is an AssertionError instead)."""

    other: str
    position: int
    ours: int
    theirs: int


def prompt_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The prompt parts of a trajectory: its runs of loss mask 0."""
    runs: list[list[int]] = []
    for token, generated, before in zip(ids, mask, [1, *mask], strict=False):
        if not generated:
            runs.append([token]) if before else runs[-1].append(token)
    return runs


def compare_ids(
    engine: str,
    model_dir: Path,
    case: str,
    ids: list[int],
    mask: list[int],
    *,
    forced: bool = False,
    engines: tuple[str, ...] = ALL_ENGINES,
) -> tuple[list[str], list[str], list[Difference]]:
    """Compare ``engine``'s trajectory of ``case`` with the record of it of every other engine in ``engines`` (the
    same model).

    Up to the first output token the engines choose differently, the trajectories must be identical: a prompt
    is the render of the same history, so a difference there (or in the loss mask) is an AssertionError. After
    such an output token the next prompts hold different outputs, unless ``forced``: every output that a later
    prompt renders is forced text (a regex), only its spelling in tokens may part, and every prompt part must
    still be equal. Returns the engines
    compared with, why the others were not, and the output differences found.
    """
    compared: list[str] = []
    missing: list[str] = []
    differences: list[Difference] = []
    digest = _model_digest(model_dir)
    for other in engines:
        path = _record_path(other, case)
        if other == engine:
            continue
        if not path.is_file():
            required(other, f"{case}: no {other} record")
            missing.append(f"no {other} record")
            continue
        theirs = json.loads(path.read_text())
        if theirs.get("model") != digest or "ids" not in theirs:
            required(other, f"{case}: the {other} record is for another model")
            missing.append(f"the {other} record is for another model")
            continue
        compared.append(other)
        their_ids, their_mask = theirs["ids"], theirs["mask"]
        position = next(
            (i for i, (a, b) in enumerate(zip(ids, their_ids, strict=False)) if a != b), min(len(ids), len(their_ids))
        )
        assert mask[:position] == their_mask[:position], f"{case}: {other}'s loss mask differs before token {position}"
        if position == len(ids) == len(their_ids):
            continue
        assert position < min(len(ids), len(their_ids)), (
            f"{case}: {engine}'s trajectory ({len(ids)} tokens) and {other}'s ({len(their_ids)}) differ in length only"
        )
        assert mask[position] == their_mask[position] == 1, (
            f"{case}: a prompt differs at token {position}: {engine} has {ids[position]}, {other} {their_ids[position]}"
            f" (the same history rendered otherwise)"
        )
        differences.append(Difference(other, position, ids[position], their_ids[position]))
        if forced:
            same = prompt_runs(ids, mask) == prompt_runs(their_ids, their_mask)
            assert same, f"{case}: a prompt part differs from {other}'s after the outputs part"
    return compared, missing, differences


NEAR_TIE = 2e-2  # nats: the engines' bf16 noise bound (tests/integration/weight_updates.py)


def near_tie(
    model_dir: Path, ids: list[int], images_before: Callable[[int], Any] | None = None
) -> Callable[[int, int], float]:
    """``gap(position, theirs)``: how far apart the logprobs of ``ids[position]`` and ``theirs`` are after
    ``ids[:position]`` under a plain bf16 forward pass of the checkpoint (tests/integration/reference.py).
    ``images_before(position)`` (a vision-language checkpoint): the image processor's output for the images shown
    before ``position``, or None where none is."""
    from .reference import Reference

    reference = Reference()

    def gap(position: int, theirs: int) -> float:
        pixels = images_before(position) if images_before else None
        ours = reference.score(model_dir, ids[: position + 1], images=pixels)[-1]
        other = reference.score(model_dir, [*ids[:position], theirs], images=pixels)[-1]
        return abs(ours - other)

    return gap


def near_ties(differences: list[Difference], gap: Callable[[int, int], float], case: str) -> list[str]:
    """One line per difference, asserting that each is a near-tie: ``gap(position, theirs)`` under
    :data:`NEAR_TIE`, so either engine's rounding may pick either token."""
    parts = []
    for d in differences:
        apart = gap(d.position, d.theirs)
        parts.append(
            f"parts from {d.other}'s at output token {d.position} ({d.ours} vs {d.theirs}: logprobs {apart:.1e} "
            f"apart under a bf16 forward pass)"
        )
        assert apart < NEAR_TIE, f"{case}: not a near-tie: {parts[-1]}"
    return parts


def record_and_compare_ids(
    engine: str,
    model_dir: Path,
    case: str,
    ids: list[int],
    mask: list[int],
    gap: Callable[[int, int], float],
    *,
    forced: bool = False,
    always_record: bool = True,
) -> str:
    """Record ``engine``'s trajectory of ``case`` and compare it with the other engines' records.

    Where the greedy output ids part (:func:`compare_ids`), the two tokens must be a near-tie: ``gap(position,
    theirs)`` (a plain bf16 forward pass: how far apart the logprobs of ``ids[position]`` and ``theirs`` are after
    ``ids[:position]``) under :data:`NEAR_TIE`, so either engine's rounding may pick either. ``always_record``
    False (the embedded backend): record only when there is nothing to compare with. Returns a line saying what
    was compared.
    """
    if always_record:
        write_ids(engine, model_dir, case, ids, mask)
    compared, missing, differences = compare_ids(engine, model_dir, case, ids, mask, forced=forced)
    if not compared and not always_record:
        write_ids(engine, model_dir, case, ids, mask)
    equal = [other for other in compared if all(d.other != other for d in differences)]
    parts = [f"{len(ids)} ids"] + [f"equal to {other}'s" for other in equal] + near_ties(differences, gap, case)
    return f"cross-engine ids, {case}: " + "; ".join(parts + missing)
