"""The trainer's recompute of recorded logprobs (tito_transformers.scoring) and the mismatch script, on the tiny Qwen3.

Free outputs: the recompute matches what the backend recorded. Outputs under a grammar: the recorded
(post-constraint) logprobs are never below the recompute and differ by many nats, which is what
``examples/train_reinforce/mismatch.py`` reports separately for forced turns.
"""

from __future__ import annotations

import importlib.util
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tito_core.backend import GenerateRequest, SamplingParams
from tito_core.drift import logprob_gap

pytest.importorskip("xgrammar")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def backends(tiny_model_dir: Path) -> Iterator[dict[str, Any]]:
    from tito_transformers import TransformersBackend

    raw = TransformersBackend(tiny_model_dir, dtype="float32", num_threads=1)
    processed = TransformersBackend(tiny_model_dir, dtype="float32", num_threads=1, logprobs_mode="processed")
    yield {"raw": raw, "processed": processed}
    raw.close()
    processed.close()


@pytest.fixture(scope="module")
def scorer(tiny_model_dir: Path) -> Any:
    from tito_transformers.scoring import load_model

    return load_model(str(tiny_model_dir))


async def _generate(backend: Any, prompt: list[int], **sampling: Any) -> Any:
    request = GenerateRequest(rid=uuid.uuid4().hex, input_ids=prompt, prefix_len=0, sampling=SamplingParams(**sampling))
    return await backend.generate(request)


async def test_recompute_matches_recorded_raw_logprobs(backends: dict[str, Any], scorer: Any, tokenizer: Any) -> None:
    from tito_transformers.scoring import token_logprobs

    prompt = tokenizer.encode("The trainer scores these tokens again:")
    result = await _generate(backends["raw"], prompt, temperature=0.8, seed=3, max_new_tokens=24, ignore_eos=True)
    assert len(result.output_ids) == 24
    new = token_logprobs(scorer, [*prompt, *result.output_ids])
    assert len(new) == len(prompt) + 24 and new[0] is None
    gap = logprob_gap(zip(result.output_logprobs, new[len(prompt) :], strict=True))
    assert gap.tokens == 24
    assert gap.max_abs < 1e-3
    assert gap.k3 < 1e-6


async def test_recompute_at_the_sampling_temperature_matches_processed_logprobs(
    backends: dict[str, Any], scorer: Any, tokenizer: Any
) -> None:
    from tito_transformers.scoring import token_logprobs_at

    prompt = tokenizer.encode("Processed logprobs follow the temperature:")
    result = await _generate(backends["processed"], prompt, temperature=0.5, seed=5, max_new_tokens=16, ignore_eos=True)
    raw, tempered = token_logprobs_at(scorer, [*prompt, *result.output_ids], (1.0, 0.5))
    recorded = result.output_logprobs
    assert logprob_gap(zip(recorded, tempered[len(prompt) :], strict=True)).max_abs < 1e-3
    # and the raw distribution is a different one: a trainer comparing it with processed logprobs is off
    assert logprob_gap(zip(recorded, raw[len(prompt) :], strict=True)).max_abs > 1e-2


async def test_constrained_logprobs_are_post_constraint(backends: dict[str, Any], scorer: Any, tokenizer: Any) -> None:
    from tito_transformers.scoring import token_logprobs

    prompt = tokenizer.encode("Answer with a tool call:")
    regex = r'<tool_call>\n\{"name": "add", "arguments": \{"a": [0-9], "b": [0-9]\}\}\n</tool_call>'
    result = await _generate(
        backends["raw"], prompt, temperature=1.0, seed=1, max_new_tokens=64, extra={"regex": regex}
    )
    assert result.finish_reason == "stop"
    new = token_logprobs(scorer, [*prompt, *result.output_ids])[len(prompt) :]
    old = result.output_logprobs
    assert all(o >= n - 1e-4 for o, n in zip(old, new, strict=True))  # masking only raises a logprob
    gap = logprob_gap(zip(old, new, strict=True))
    assert gap.max_abs > 5.0  # tokens the grammar forced, which the random model finds unlikely
    assert gap.mean_diff < -1.0


def _load_script() -> Any:
    spec = importlib.util.spec_from_file_location("mismatch_script", ROOT / "examples/train_reinforce/mismatch.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOL_MODULE = '''
from strands import tool


@tool
def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return str(a + b)
'''


def test_mismatch_script_measures_forced_and_free_turns(tmp_path: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "tiny_tools.py").write_text(TOOL_MODULE)
    config = tmp_path / "tito.toml"
    config.write_text(
        f"""backend = "transformers"
tokenizer = "{tiny_model_dir}"
tool_parser = "hermes"

[backend_options]
model_path = "{tiny_model_dir}"
dtype = "float32"
num_threads = 1

[sampling]
temperature = 1.0
max_new_tokens = 24

[rollout]
group_size = 2
tools = ["tiny_tools:add"]
forced_tool_calls = 1
max_model_calls = 2
"""
    )
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t0", "prompt": "Add 2 and 3.", "answer": "5"}) + "\n")
    out = tmp_path / "report.json"
    script = _load_script()
    assert (
        script.main([str(tmp_path / "r.jsonl"), "--config", str(config), "--collect", str(tasks), "--json", str(out)])
        == 0
    )
    report = json.loads(out.read_text())
    assert report["measured_rollouts"] == 2
    assert report["turns"]["constrained"] == 2
    forced = report["logprobs"]["forced"]
    assert forced["tokens"] > 0 and forced["max_abs"] > 5.0
    assert report["logprobs"]["tool_call_forced"]["tokens"] > 0
    free = report["logprobs"]["free"]
    if free["tokens"]:  # a second, unconstrained call happened: its logprobs match the recompute
        assert free["max_abs"] < 1e-3
    drift = report["drift"]
    assert drift["compared_rollouts"] == 2
    for row in report["per_rollout"]:
        assert row["drift"]["recorded_tokens"] == row["tokens"]
