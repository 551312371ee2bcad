"""``tito view``: a read-only web viewer of a rollout file (:mod:`tito_core.viewer`) on the command line.

    tito view rollouts.jsonl [--port 8200] [--config tito.toml | --tokenizer DIR] [--audit report.json]
        [--figure report.png ...]

It serves on loopback only (it has no credential; a non-loopback ``--host`` is refused) until Ctrl-C, and
prints ``tito view: serving on http://HOST:PORT`` once it does. Exits 2 on an error found before serving: every
error of the arguments and the file (a malformed line, an empty file, a report of other records, a tokenizer the
records were not made with) is one line, found before the tokenizer loads where it can be.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
import time
from typing import Any

from ..errors import ConfigError

__all__ = ["add_view_command", "decoding_tokenizer", "run_view"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_view_command(commands: Any) -> None:
    """Add ``tito view`` to the ``tito`` parser's subcommands."""
    view = commands.add_parser(
        "view",
        help="serve a read-only web viewer of a rollout file",
        description="Serve a rollout file (JSONL or Parquet, its images) as web pages: the runs, and each record "
        "token by token with its loss mask, logprobs, weight versions, images and branches. Loopback only.",
    )
    view.add_argument(
        "records", help="a rollout file (.jsonl, .parquet) of `tito rollout` or `tito serve`, or a trajectory file "
        "(`tito demo`'s, Trajectory.to_json)",
    )  # fmt: skip
    view.add_argument("--port", type=int, default=8200, help="the port (default 8200; 0: any free port)")
    view.add_argument("--host", default="127.0.0.1", help="a loopback address (default 127.0.0.1)")
    decode = view.add_mutually_exclusive_group()
    decode.add_argument("--tokenizer", help="decode the tokens as text with this tokenizer (else token ids)")
    decode.add_argument("--config", help="decode the tokens as text with this TOML config's tokenizer")
    view.add_argument(
        "--audit", metavar="REPORT.json", help="a `tito audit --json` report (with --per-token: a heat map of each "
        "token's |Δlogprob| on the record pages)",
    )  # fmt: skip
    view.add_argument(
        "--figure", action="append", default=[], metavar="PNG",
        help="a PNG to show on the runs page (`tito audit --plot`, the A/B benchmark's plots)",
    )  # fmt: skip


def decoding_tokenizer(args: argparse.Namespace) -> Any:
    """The tokenizer of ``--tokenizer``, or of ``--config``'s ``tokenizer`` (loaded as the runner does); or None.

    A config without ``tokenizer`` whose ``prepare`` hook sets it (the arithmetic example) has the hook run.
    """
    from ..tokenizers import load_tokenizer

    if args.tokenizer:
        return load_tokenizer(args.tokenizer)
    if not args.config:
        return None
    from ..config import load_config
    from ..runner.interrupts import run_interruptible
    from ..runner.run import prepare_config

    config = load_config(args.config)
    if config.tokenizer is None and config.rollout.prepare:
        config, _ = run_interruptible(prepare_config(args.config, {}))
    if config.tokenizer is None:
        raise ConfigError(f"{args.config}: no `tokenizer` to decode with (give --tokenizer)")
    return load_tokenizer(config.tokenizer)


def run_view(args: argparse.Namespace) -> int:
    """Serve ``args.records`` until SIGINT / SIGTERM; 0 then."""
    from ..records import read_rollout_file
    from ..viewer import FileSource

    if args.host not in LOOPBACK:
        raise ConfigError(f"--host {args.host}: the viewer has no credential, so it serves on loopback only "
                          f"({', '.join(LOOPBACK)}); reach it from elsewhere through an SSH tunnel")  # fmt: skip
    started = time.perf_counter()
    rollouts = read_rollout_file(args.records)
    for note in rollouts.notes():
        print(f"tito view: {note}", file=sys.stderr)
    if not rollouts.records:
        raise ConfigError(f"{args.records}: no rollout records in it: nothing to show")
    source = FileSource(rollouts, audit=args.audit, figures=args.figure)
    read = f"{len(source.records)} records read in {time.perf_counter() - started:.2f} s"
    if rollouts.trajectories:
        read += " (a trajectory file: each trajectory shown as a record)"
    started = time.perf_counter()
    tokenizer = decoding_tokenizer(args)
    if tokenizer is not None:
        source.decode_with(
            tokenizer, f"--tokenizer {args.tokenizer}" if args.tokenizer else f"{args.config}'s tokenizer"
        )
        read += f"; tokenizer loaded in {time.perf_counter() - started:.1f} s"
    print(f"tito view: {read}", file=sys.stderr)
    return asyncio.run(_serve(source, args.host, args.port))


async def _serve(source: Any, host: str, port: int) -> int:
    from aiohttp import web

    from ..viewer import browser_rules, viewer_app

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot serve on {host}:{port}: {exc.strerror}") from None
    bound = sock.getsockname()[1]
    refuse = browser_rules(frozenset(f"{name}:{bound}" for name in ("localhost", "127.0.0.1", "[::1]")))
    runner = web.AppRunner(viewer_app(source, refuse=refuse), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    shown = f"[{host}]" if ":" in host else host
    print(f"tito view: serving on http://{shown}:{bound}", flush=True)
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await runner.cleanup()
    return 0
