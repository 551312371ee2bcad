"""tito_core.trainers without the trainers installed: verl's server manager as a backend, TRL's rollout_func."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tito_core.backend import GenerateRequest, SamplingParams
from tito_core.errors import BackendResponseError
from tito_core.trainers.verl import VerlServerBackend
from tito_core.versions import VersionSpan


class Server:
    """verl's server-manager interface, answering a fixed TokenOutput-like object."""

    def __init__(self, ids, log_probs, stop_reason="completed", extra_fields=None):
        self.out = SimpleNamespace(token_ids=ids, log_probs=log_probs, stop_reason=stop_reason)
        if extra_fields is not None:
            self.out.extra_fields = extra_fields
        self.calls = []

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        self.calls.append((request_id, prompt_ids, sampling_params))
        return self.out


def request(**sampling):
    return GenerateRequest(rid="r1", input_ids=[1, 2, 3], prefix_len=0, sampling=SamplingParams(**sampling))


def test_verl_backend_sends_the_prompt_and_maps_the_output():
    server = Server([7, 8], [-0.5, -0.25])
    backend = VerlServerBackend(server, {"temperature": 1.0, "top_p": 0.9, "logprobs": False})
    result = asyncio.run(backend.generate(request(max_new_tokens=4, temperature=0.5, stop_token_ids=(9,))))
    rid, prompt, params = server.calls[0]
    assert rid == "r1" and prompt == [1, 2, 3]
    assert params == {"temperature": 0.5, "top_p": 0.9, "logprobs": True, "max_tokens": 4, "stop_token_ids": [9]}
    assert result.output_ids == [7, 8] and result.output_logprobs == [-0.5, -0.25]
    assert result.finish_reason == "stop" and backend.generate_seconds > 0


@pytest.mark.parametrize(
    ("stop_reason", "max_new_tokens", "finish"),
    [("completed", 2, "length"), ("aborted", 8, "abort"), (None, 8, "stop")],
)
def test_verl_backend_finish_reasons(stop_reason, max_new_tokens, finish):
    backend = VerlServerBackend(Server([7, 8], [-0.5, -0.25], stop_reason))
    assert asyncio.run(backend.generate(request(max_new_tokens=max_new_tokens))).finish_reason == finish


@pytest.mark.parametrize(("log_probs", "message"), [(None, "no log_probs"), ([-0.5], "1 log_probs for 2 token_ids")])
def test_verl_backend_refuses_misaligned_logprobs(log_probs, message):
    backend = VerlServerBackend(Server([7, 8], log_probs))
    with pytest.raises(BackendResponseError, match=message) as info:
        asyncio.run(backend.generate(request()))
    assert info.value.field == "log_probs" and info.value.backend == "verl"


def test_trainer_modules_do_not_import_their_trainers():
    code = (
        "import sys, tito_core.trainers.trl, tito_core.trainers.verl, tito_core.trainers.agentlightning;"
        "print(sorted(m for m in ('trl', 'verl', 'agentlightning', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_rollout_func_needs_a_positive_concurrency():
    from tito_core.trainers.trl import rollout_func

    async def rollout(prompt):
        raise AssertionError("not called")

    with pytest.raises(ValueError, match="max_concurrency"):
        rollout_func(rollout, max_concurrency=0)


@pytest.mark.parametrize(
    ("extra_fields", "versions"),
    [
        (
            {"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3},
            (VersionSpan(version="3", start=0, end=2),),
        ),
        ({"global_steps": 4, "min_global_steps": 3, "max_global_steps": 4}, None),  # resumed across an update
        ({"global_steps": None, "min_global_steps": None, "max_global_steps": None}, None),  # no update yet
        ({"global_steps": 3}, None),  # the server's step when it answered: not necessarily every token's
        (None, None),
    ],
)
def test_verl_backend_reports_the_global_step_as_the_weight_version(extra_fields, versions):
    backend = VerlServerBackend(Server([7, 8], [-0.5, -0.25], extra_fields=extra_fields))
    assert asyncio.run(backend.generate(request())).weight_versions == versions
