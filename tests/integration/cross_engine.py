"""Same tiny model, same greedy prompt: vLLM and SGLang must produce the same output ids.

Each real-server suite records its greedy ids under the tito cache; whichever suite runs second (with
the byte-identical tiny model) compares against the other's record.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

from tito_core.backend import Backend, GenerateRequest, SamplingParams
from tito_testing.tokenizers import cache_root

ENGINES = ("vllm", "sglang")
MESSAGES = [{"role": "user", "content": "Name three prime numbers, then explain why they are prime."}]
NEW_TOKENS = 24


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


def record_and_compare(
    engine: str, model_dir: Path, prompt: list[int], output: list[int], *, case: str = ""
) -> str | None:
    """Record this engine's ids; compare with the other engine's record of the same ``case`` (e.g. ``"images"``).

    Returns None when compared (an AssertionError is raised on a difference), else why no comparison was
    possible.
    """
    folder = cache_root() / "cross-engine"
    folder.mkdir(parents=True, exist_ok=True)
    record = {"model": _model_digest(model_dir), "prompt": prompt, "output": output}
    suffix = f"-{case}" if case else ""
    (folder / f"{engine}{suffix}.json").write_text(json.dumps(record))
    other = next(e for e in ENGINES if e != engine)
    path = folder / f"{other}{suffix}.json"
    if not path.is_file():
        return f"no {other} record yet (its suite has not run on this machine)"
    theirs = json.loads(path.read_text())
    if theirs["model"] != record["model"] or theirs["prompt"] != prompt:
        return f"the {other} record is for another model or prompt"
    assert theirs["output"] == output, f"greedy ids differ: {other} {theirs['output']} vs {engine} {output}"
    return None
