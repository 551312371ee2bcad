"""Long agents (issue 20): 128 and 200 model calls, tito against strands-sglang and the no-op floor, per rollout.

The workloads of trl #6250 (128 turns, a 69k-token context: re-rendering and re-tokenizing the history took
56 % of generation time) and verl #7619 (a 200-turn agent loop: ~34 % of rollout wall time). What a client
does per call that grows with the trajectory is paid once per call, so over a long agent it adds up to
O(turns x trajectory): this script measures how much of a whole rollout the client takes.

**Fake server** (``run.py``'s machinery: ``fake_sglang.py`` and one ``client.py`` worker per implementation,
the order rotating per repeat): every call generates ``--per-turn`` tokens of reasoning and a tool call, the
tool returns ``--per-turn`` tokens, for ``--turns`` calls (253 each: the 128-call trajectory ends at ~70k
tokens, the 200-call one at ~109k). Per rollout: the client time (sum over calls of ``stream()`` minus the
server's handler time), the rollout's wall time, the client's share of it, the time above the no-op floor
(whole loop minus server and tool time, minus the floor's) and the tokenizer time.

**Real SGLang** (``real_engines.py``'s machinery: the CPU server of the integration suite, tiny random Qwen3,
its context and KV pool raised to ``--real-context``): one long agent of ``--real-calls`` regex-constrained
calls whose tool returns ``--real-tool-tokens`` tokens, with ``SGLangBackend(session="off")`` and
``session="on"``: round trip and client time per call, the client's share of the rollout, ids and bytes each
call sends. Needs ``.nox/integration_sglang`` (or ``TITO_SGLANG_PYTHON``); ``--no-real`` skips it. The CPU
engine's time per call grows faster than the context (on 2 cores: 0.24 s at 0.5k tokens, 0.6-0.9 s at 11k,
5.5-5.8 s at 40k), so the default (40-token tool results, ~11k tokens after 128 calls) keeps each rollout
to about a minute; 250-token results (~40k tokens) took 5.3 minutes per rollout.

Usage:
    python benchmarks/long_agent.py --peer-python .nox/bench-strands-sglang/bin/python
    python benchmarks/long_agent.py --no-peer --turns 128 --repeats 1 --no-real
    python benchmarks/long_agent.py --no-fake --real-calls 32      # the real server only, shorter
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import NAMES, client_workers, fake_server, fmt, latency_rows, post_json, ratio  # noqa: E402
from workload import Workload, filler  # noqa: E402

FAKE_IMPLS = ("noop", "tito", "tito-sessions", "peer")
PEER_VENV = HERE.parent / ".nox" / "bench-strands-sglang" / "bin" / "python"


def median(values: list[float]) -> float:
    """Median (nan when empty)."""
    return statistics.median(values) if values else float("nan")


# ------------------------------------------------------------------------------------------ fake server
def per_rollout(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Per-rollout figures (seconds; medians over the timed rollouts) from ``client.py``'s latency rows."""
    client = [sum(s - v for s, v in zip(row["stream"], row["server"], strict=True)) for row in rows]
    wall = [row["wall"] for row in rows]
    return {
        "client_s": median(client),
        "wall_s": median(wall),
        "share": median([c / w for c, w in zip(client, wall, strict=True)]),
        "loop_s": median([row["wall"] - sum(row["server"]) - row["tool"] for row in rows]),
        "server_s": median([sum(row["server"]) for row in rows]),
        "tokenizer_s": median([row["tokenizer"] for row in rows]),
        "last_call_ms": median([1e3 * (row["stream"][-1] - row["server"][-1]) for row in rows]),
        "tokens": float(rows[-1]["tokens"]),
    }


def fake_runs(args: argparse.Namespace) -> dict[str, dict[str, dict[str, float]]]:
    """Every ``--turns`` workload on the fake server: {turns: {implementation: per-rollout figures}}."""
    from tito_testing.tokenizers import qwen_tokenizer_dir

    tokenizer_dir = str(qwen_tokenizer_dir("qwen3"))
    impls = [impl for impl in FAKE_IMPLS if impl != "peer" or args.peer_python]
    workloads = [Workload(calls=int(n), think=args.per_turn, tool=args.per_turn) for n in args.turns.split(",") if n]
    figures: dict[str, dict[str, dict[str, float]]] = {}
    with (
        fake_server(tokenizer_dir, workloads[0]) as url,
        client_workers(impls, tokenizer_dir, args.peer_python) as workers,
    ):
        for workload in workloads:
            post_json(url + "/configure", workload.as_dict())
            print(f"  fake server, {workload.calls} calls: {', '.join(impls)} ...", file=sys.stderr, flush=True)
            rows = latency_rows(workers, url, workload, args.repeats)
            figures[str(workload.calls)] = {impl: per_rollout(rows[impl]) for impl in impls}
    return figures


def render_fake(figures: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """The fake-server table and the tito / peer ratios."""
    lines = [
        "| agent | trajectory tokens | implementation | client s/rollout | rollout wall s | client share of rollout | "
        "above floor s/rollout | above floor, share of rollout | tokenizer s/rollout | client ms, last call |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for turns, by_impl in figures.items():
        floor = by_impl["noop"]["loop_s"] if "noop" in by_impl else None
        tokens = by_impl.get("tito", next(iter(by_impl.values())))["tokens"]
        for impl, row in by_impl.items():
            above = row["loop_s"] - floor if floor is not None and impl != "noop" else None
            lines.append(
                f"| {turns} calls | {int(tokens)} | {NAMES.get(impl, impl)} | {fmt(row['client_s'], 3)} | "
                f"{fmt(row['wall_s'])} | {fmt(100 * row['share'], 1)} % | {fmt(above)} | "
                f"{fmt(100 * above / row['wall_s'], 1) + ' %' if above is not None else '-'} | "
                f"{fmt(row['tokenizer_s']) if impl != 'noop' else '-'} | {fmt(row['last_call_ms'])} |"
            )
    lines.append("")
    for turns, by_impl in figures.items():
        tito, peer = by_impl.get("tito"), by_impl.get("peer")
        if tito and peer:
            lines.append(
                f"{turns} calls: strands-sglang / tito client time = {fmt(ratio(peer['client_s'], tito['client_s']))}, "
                f"rollout wall = {fmt(ratio(peer['wall_s'], tito['wall_s']))}"
            )
    return lines


# ------------------------------------------------------------------------------------------ real SGLang
def real_runs(args: argparse.Namespace) -> dict[str, dict[str, Any]] | str:
    """One long agent on the real SGLang CPU server per session mode; a reason when not measured."""
    import real_engines

    python = real_engines.server_python("sglang")
    if python is None:
        return "not measured: no interpreter with sglang (run nox -s integration_sglang)"
    from tito_testing.tokenizers import load_qwen_tokenizer

    blob = filler(load_qwen_tokenizer("qwen3"), args.real_tool_tokens, seed=7)
    modes = [mode for mode in args.real_sessions.split(",") if mode]
    out: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    with real_engines.sglang_server(python, context_length=args.real_context) as url:
        print(f"  sglang ready at {url} after {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        for mode in modes:
            print(f"  real sglang, {args.real_calls} calls, session={mode} ...", file=sys.stderr, flush=True)
            out[mode] = asyncio.run(
                real_engines.measure(
                    "sglang",
                    url,
                    args.real_rollouts,
                    args.real_calls,
                    blob=blob,
                    warmup_calls=args.real_warmup_calls,
                    # A prompt of its own per mode: neither run finds the other's prefixes in the radix cache.
                    prompt=f"Find the answer with the lookup tool (session {mode}).",
                    session=mode,
                )
            )
    return out


def render_real(figures: dict[str, dict[str, Any]], calls: int) -> list[str]:
    """The real-server table."""
    lines = [
        "| sessions | model calls | trajectory tokens | rollout wall s | round trip ms/call (median / last) | "
        "client ms/call (median / last) | client s/rollout | client share of rollout | ids sent/call "
        "(median / last) | ids sent/rollout | request KB/call (median / last) | session requests s/rollout |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, f in figures.items():
        walls, rollouts = f["wall"], len(f["wall"])
        client_sums = [sum(f["client"][i * calls : (i + 1) * calls]) for i in range(rollouts)]
        ids_sums = [sum(f["ids_sent"][i * calls : (i + 1) * calls]) for i in range(rollouts)]
        lines.append(
            f"| {mode} | {calls} x {rollouts} | {max(f['tokens'])} | {fmt(median(walls), 1)} | "
            f"{fmt(1e3 * median(f['server']), 1)} / {fmt(1e3 * f['server'][-1], 1)} | "
            f"{fmt(1e3 * median(f['client']))} / {fmt(1e3 * f['client'][-1])} | {fmt(median(client_sums))} | "
            f"{fmt(100 * median([c / w for c, w in zip(client_sums, walls, strict=True)]), 2)} % | "
            f"{fmt(median(f['ids_sent']), 0)} / {f['ids_sent'][-1]} | {fmt(median(ids_sums), 0)} | "
            f"{fmt(median(f['body_bytes']) / 1e3, 1)} / {fmt(f['body_bytes'][-1] / 1e3, 1)} | "
            f"{fmt(median(f['session_posts']), 3)} |"
        )
    return lines


# ------------------------------------------------------------------------------------------ entry point
def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", default="", help="python of a venv with strands-sglang (Python >= 3.12)")
    parser.add_argument("--no-peer", action="store_true", help="measure tito and the floor only")
    parser.add_argument("--turns", default="128,200", help="model calls per rollout, one fake-server agent each")
    parser.add_argument("--per-turn", type=int, default=253, help="reasoning and tool-result tokens per call")
    parser.add_argument("--repeats", type=int, default=2, help="timed rollouts per agent (after one warm-up)")
    parser.add_argument("--fake", action=argparse.BooleanOptionalAction, default=True, help="the fake-server runs")
    parser.add_argument("--real", action=argparse.BooleanOptionalAction, default=True, help="the real SGLang run")
    parser.add_argument("--real-calls", type=int, default=128, help="model calls of the real-server agent")
    parser.add_argument("--real-tool-tokens", type=int, default=40, help="tokens the real-server tool returns")
    parser.add_argument("--real-context", type=int, default=131072, help="the real server's context and KV pool")
    parser.add_argument("--real-rollouts", type=int, default=1, help="timed real-server rollouts per session mode")
    parser.add_argument("--real-warmup-calls", type=int, default=8, help="calls of the warm-up rollout per mode")
    parser.add_argument("--real-sessions", default="off,on", help="session modes of the real-server runs, in order")
    parser.add_argument("--json", default="", help="also write the figures (the real server's per call) as JSON here")
    args = parser.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if args.no_peer:
        args.peer_python = ""
    elif not args.peer_python and PEER_VENV.exists():
        args.peer_python = str(PEER_VENV)
    if args.fake and not args.peer_python:
        print("note: no --peer-python (nor .nox/bench-strands-sglang): strands-sglang is not measured", file=sys.stderr)

    started = time.monotonic()
    lines: list[str] = []
    report: dict[str, Any] = {}
    if args.fake:
        fake = report["fake"] = fake_runs(args)
        lines += [
            f"Long agents, fake SGLang server, Qwen3 tokenizer: {args.per_turn} reasoning + {args.per_turn} "
            f"tool-result tokens per call, {args.repeats} timed rollouts (median) after a warm-up; python "
            f"{platform.python_version()}, {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.2f}",
            "",
            *render_fake(fake),
            "",
        ]
    if args.real:
        try:
            real = real_runs(args)
        except Exception as exc:  # reported in the output: the fake-server figures above still stand
            real = f"not measured: {type(exc).__name__}: {str(exc)[:300]}"
        report["real"] = real
        lines.append(
            f"Long agent, real SGLang CPU server (tiny random Qwen3, context {args.real_context}): "
            f"{args.real_calls} calls, tool results of {args.real_tool_tokens} tokens, {args.real_rollouts} timed "
            f"rollout(s) per mode after a {args.real_warmup_calls}-call warm-up; load average "
            f"{os.getloadavg()[0]:.2f}"
        )
        lines.append("")
        lines += [f"sglang: {real}"] if isinstance(real, str) else render_real(real, args.real_calls)
    lines.append(f"\n{time.monotonic() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
