"""tito's client time as a share of the server's time per model call, on real vLLM and SGLang CPU servers.

Starts each engine the way the integration suites do (tests/integration/{vllm,sglang}/conftest.py: a tiny
random Qwen3 built on the spot, CPU flags, loopback only, stopped at the end), then runs Strands agent
rollouts through ``TitoModel``: constrained decoding (``regex``) makes the random model call a ``lookup``
tool ``--calls - 1`` times and then answer, so every rollout has real multi-turn token traffic.

Per model call: ``round trip`` is the time spent awaiting the HTTP POST (engine time plus loopback and the
HTTP client's own work, so the client share below is if anything understated by the HTTP client part,
which the fake-server benchmark measures separately); ``client`` is the rest of ``stream()``: planning,
templating, tokenizing, request building, response decoding, trajectory bookkeeping, tool parsing and
Strands' handling of the events.

Interpreters: ``TITO_SGLANG_PYTHON`` / ``TITO_VLLM_PYTHON``, else ``.nox/integration_sglang`` /
``.nox/integration_vllm`` (made by ``nox -s integration_sglang`` / ``integration_vllm``). An engine with
no interpreter is reported as not measured.

Usage:
    python benchmarks/real_engines.py [--engines sglang,vllm] [--rollouts 3] [--calls 6] [--fake-server]

``--fake-server`` runs the same rollouts on the fake SGLang server instead (a smoke run: ``nox -s bench_smoke``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
TOOL_RX = r'<tool_call>\n\{"name": "lookup", "arguments": \{"query": "item-[0-9]"\}\}\n</tool_call>'
FINAL_RX = r"The answer is [0-9]{1,2}\."
BLOB = " ".join(f"fact{i} holds value {i * 7 % 101}." for i in range(40))
SESSION_PATHS = ("/open_session", "/close_session")
"""SGLang session requests: through the same HTTP client, not model calls."""
warnings.filterwarnings("ignore")


def _suite(module: str) -> ModuleType:
    """A module of the integration suites (server flags, process helpers), imported, not copied."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"tests.integration.{module}")


def _warm_sglang(client: httpx.Client) -> None:
    warm = {"input_ids": [151644, 872, 198], "sampling_params": {"max_new_tokens": 4}}
    client.post("/generate", json=warm, timeout=300.0).raise_for_status()


def _warm_vllm(client: httpx.Client) -> None:
    warm = {"model": "tiny", "prompt": [151644, 872, 198], "max_tokens": 4}
    for _ in range(2):
        client.post("/v1/completions", json=warm, timeout=300.0).raise_for_status()


def server_python(engine: str) -> str | None:
    """The interpreter that has the engine installed, or None."""
    configured = os.environ.get(f"TITO_{engine.upper()}_PYTHON")
    if configured:
        return configured
    candidate = ROOT / ".nox" / f"integration_{engine}" / "bin" / "python"
    return str(candidate) if candidate.exists() else None


def tiny_model(python: str) -> Path:
    """Build (or reuse) the tiny random Qwen3 with the engine's interpreter; return its directory."""
    done = subprocess.run(
        [python, "-m", "tito_testing.tiny_model"], capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"building the tiny model failed:\n{done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def with_context(flags: list[str], context_length: int) -> list[str]:
    """``flags`` with ``--context-length`` and ``--max-total-tokens`` (the KV pool) set to ``context_length``."""
    out = list(flags)
    for flag in ("--context-length", "--max-total-tokens"):
        if flag in out:
            out[out.index(flag) + 1] = str(context_length)
        else:
            out += [flag, str(context_length)]
    return out


@contextmanager
def sglang_server(python: str, context_length: int | None = None) -> Iterator[str]:
    """An SGLang CPU server started as tests/integration/sglang/conftest.py starts it.

    ``context_length`` replaces the suite's 4,096-token context and KV pool (the tiny model's own limit is
    4,096 positions: SGLang is told to allow more; its random weights do not care).
    """
    helpers, servers = _suite("sglang.conftest"), _suite("servers")
    flags = helpers.SERVER_FLAGS if context_length is None else with_context(helpers.SERVER_FLAGS, context_length)
    extra = {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"} if context_length is not None else {}
    with servers.sglang_process(
        python,
        tiny_model(python),
        Path(tempfile.mkdtemp(prefix="tito-bench-sglang-")),
        flags=flags,
        kernel_stand_in=helpers.SGL_KERNEL_STANDIN,
        warm_up=_warm_sglang,
        env=extra,
    ) as url:
        yield url


@contextmanager
def vllm_server(python: str) -> Iterator[str]:
    """A vLLM CPU server started as tests/integration/vllm/conftest.py starts it."""
    helpers, servers = _suite("vllm.conftest"), _suite("servers")
    model = tiny_model(python)
    port = servers.free_port()
    log = Path(tempfile.mkdtemp(prefix="tito-bench-vllm-")) / "server.log"
    command = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--host", "127.0.0.1", "--port", str(port), *helpers.SERVER_FLAGS,
    ]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, **helpers.SERVER_ENV},
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        servers.wait_until_healthy(url, process, log, name="vllm", timeout=300.0, warm_up=_warm_vllm)
        yield url
    finally:
        servers.stop_process_group(process)


def backend_for(engine: str, url: str, **options: Any) -> Any:
    """Tito's backend for the engine (``options`` go to its constructor, e.g. ``session="on"`` for SGLang)."""
    if engine == "sglang":
        from tito_sglang import SGLangBackend

        return SGLangBackend(url, timeout=300.0, **options)
    from tito_vllm import VLLMBackend

    return VLLMBackend(url, timeout=300.0, **options)


def constrain(engine: str, regex: str) -> dict[str, Any]:
    """``SamplingParams.extra`` restricting the output to ``regex``."""
    return {"regex": regex} if engine == "sglang" else {"structured_outputs": {"regex": regex}}


async def measure(
    engine: str,
    url: str,
    rollouts: int,
    calls: int,
    *,
    blob: str = BLOB,
    warmup_calls: int | None = None,
    prompt: str = "Find the answer with the lookup tool.",
    **backend_options: Any,
) -> dict[str, Any]:
    """Run rollouts; return per-call round-trip and client times (seconds) and what each call sent.

    The first rollout is a warm-up of ``warmup_calls`` calls (default ``calls``); the tool returns ``blob``;
    ``backend_options`` go to the backend (``session=...``). Per timed call also the ids the ``/generate`` body
    carried and its bytes (counted after the rollout, outside every timer); per timed rollout its wall time and
    the time its SGLang session requests (``/open_session``, ``/close_session``) took.
    """
    from strands import Agent, tool
    from strands.agent.conversation_manager import NullConversationManager
    from strands.hooks import BeforeModelCallEvent

    from tito_core import TitoModel
    from tito_testing.tokenizers import load_qwen_tokenizer

    tokenizer = load_qwen_tokenizer("qwen3")
    backend = backend_for(engine, url, **backend_options)
    http = backend._http
    inner_post = http.post
    round_trips: list[float] = []
    sent: list[bytes] = []  # the request bodies of the model calls (kept by reference, read after the rollout)
    session_posts: list[float] = []

    async def timed_post(path: str, body: bytes, *args: Any, **kwargs: Any) -> bytes:
        if path in SESSION_PATHS:  # not a model call: timed apart (it counts in the client time of its call)
            started = time.perf_counter()
            answer: bytes = await inner_post(path, body, *args, **kwargs)
            session_posts.append(time.perf_counter() - started)
            return answer
        sent.append(body)
        started = time.perf_counter()
        try:
            answer = await inner_post(path, body, *args, **kwargs)
            return answer
        finally:
            round_trips.append(time.perf_counter() - started)

    http.post = timed_post
    per_call_client: list[float] = []
    per_call_server: list[float] = []
    tokens: list[int] = []
    ids_sent: list[int] = []
    body_bytes: list[int] = []
    walls: list[float] = []
    session_seconds: list[float] = []
    try:
        for index in range(rollouts + 1):  # the first is a warm-up
            n_calls = calls if index or warmup_calls is None else warmup_calls
            model = TitoModel(backend, tokenizer, tool_parser="hermes")
            streams: list[float] = []
            inner_stream = model.stream

            async def stream(*args: Any, _inner: Any = inner_stream, _out: list[float] = streams, **kw: Any) -> Any:
                started = time.perf_counter()
                async for event in _inner(*args, **kw):
                    yield event
                _out.append(time.perf_counter() - started)

            model.stream = stream  # type: ignore[method-assign]

            @tool
            def lookup(query: str) -> str:
                """Look up a query in the knowledge base.

                Args:
                    query: what to look up.
                """
                return f"Result for {query}: {blob}"

            agent = Agent(
                model=model,
                tools=[lookup],
                callback_handler=None,
                conversation_manager=NullConversationManager(),
                system_prompt="You are a research assistant. Use the lookup tool.",
            )

            def steer(event: BeforeModelCallEvent, _model: Any = model, _calls: int = n_calls) -> None:
                regex = TOOL_RX if len(_model.trajectory.turns) < _calls - 1 else FINAL_RX
                _model.update_config(
                    sampling={"temperature": 0.0, "max_new_tokens": 64, "extra": constrain(engine, regex)}
                )

            agent.hooks.add_callback(BeforeModelCallEvent, steer)
            round_trips.clear()
            sent.clear()
            session_posts.clear()
            started = time.perf_counter()
            await agent.invoke_async(prompt)
            wall = time.perf_counter() - started
            if len(streams) != n_calls or len(round_trips) != n_calls:
                raise RuntimeError(
                    f"{engine}: {len(streams)} model calls, {len(round_trips)} POSTs, expected {n_calls}"
                )
            if index == 0:
                continue
            per_call_server.extend(round_trips)
            per_call_client.extend(s - r for s, r in zip(streams, round_trips, strict=True))
            tokens.append(len(model.trajectory))
            walls.append(wall)
            session_seconds.append(sum(session_posts))
            body_bytes.extend(len(body) for body in sent)
            ids_sent.extend(request_ids(body) for body in sent)
    finally:
        await backend.aclose()
    return {
        "client": per_call_client,
        "server": per_call_server,
        "tokens": tokens,
        "wall": walls,
        "ids_sent": ids_sent,
        "body_bytes": body_bytes,
        "session_posts": session_seconds,
    }


def request_ids(body: bytes) -> int:
    """How many token ids a model call's request body carried (SGLang ``input_ids``, vLLM a token-id ``prompt``)."""
    payload = json.loads(body)
    for key in ("input_ids", "prompt", "prompt_token_ids"):
        if isinstance(payload.get(key), list):
            return len(payload[key])
    return 0


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sglang,vllm")
    parser.add_argument("--rollouts", type=int, default=3, help="timed rollouts per engine (after one warm-up)")
    parser.add_argument("--calls", type=int, default=6, help="model calls per rollout")
    parser.add_argument(
        "--fake-server",
        action="store_true",
        help="measure on the fake SGLang server (benchmarks/fake_sglang.py) instead of the engines: a smoke run of "
        "this script that needs no engine (its figures say nothing about a real engine)",
    )
    args = parser.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    lines = [
        "| engine | model calls | trajectory tokens | round trip ms/call (median) | tito client ms/call (median) | "
        "client / round trip |",
        "|---|---|---|---|---|---|",
    ]
    if args.fake_server:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from run import fake_server
        from workload import Workload

        from tito_testing.tokenizers import qwen_tokenizer_dir

        with fake_server(str(qwen_tokenizer_dir("qwen3")), Workload.for_size(300, args.calls)) as url:
            figures = asyncio.run(measure("sglang", url, args.rollouts, args.calls, session="off"))
        lines.append(_row("fake sglang", figures))
        print("\n".join(lines))
        return
    for engine in [e for e in args.engines.split(",") if e]:
        python = server_python(engine)
        if python is None:
            lines.append(f"| {engine} | not measured: no interpreter with {engine} (run nox -s integration_{engine}) |")
            continue
        server = sglang_server if engine == "sglang" else vllm_server
        started = time.monotonic()
        try:
            with server(python) as url:
                print(f"  {engine} ready at {url} after {time.monotonic() - started:.0f} s", file=sys.stderr)
                figures = asyncio.run(measure(engine, url, args.rollouts, args.calls))
        except Exception as exc:  # reported in the table: one engine failing does not hide the other
            lines.append(f"| {engine} | not measured: {type(exc).__name__}: {str(exc)[:200]} |")
            continue
        lines.append(_row(engine, figures))
    print("\n".join(lines))


def _row(engine: str, figures: dict[str, Any]) -> str:
    """One engine's row of the table."""
    client = statistics.median(figures["client"]) * 1e3
    server_ms = statistics.median(figures["server"]) * 1e3
    share = statistics.median([c / s for c, s in zip(figures["client"], figures["server"], strict=True)])
    return (
        f"| {engine} | {len(figures['client'])} | {max(figures['tokens'])} | {server_ms:.1f} | {client:.2f} | "
        f"{100 * share:.2f}% |"
    )


if __name__ == "__main__":
    main()
