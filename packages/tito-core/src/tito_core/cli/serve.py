"""The ``tito serve`` command line: its arguments, and the run (the gateway itself is :mod:`tito_core.gateway`).

Kept apart from :mod:`tito_core.cli` so that parsing the command line imports no gateway code.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

__all__ = ["add_serve_command", "run_serve"]


def add_serve_command(commands: Any) -> None:
    """Add ``tito serve`` and its arguments to the ``tito`` subcommands."""
    serve = commands.add_parser("serve", help="an OpenAI-compatible gateway recording every rollout (docs/gateway.md)")
    serve.add_argument(
        "--config",
        required=True,
        help="TOML config (backend, tokenizer, tool parser, sampling); its rollout.prepare runs first",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (not loopback: --api-key is required)")
    serve.add_argument("--port", type=int, default=8100, help="port (0: a free one; the address is printed)")
    serve.add_argument("-o", "--output", help="rollout file finished rollouts are written to (.jsonl or .parquet)")
    serve.add_argument(
        "--api-key",
        help="the key that opens rollouts (Authorization: Bearer KEY); visible in the process list: prefer "
        "--api-key-file or TITO_API_KEY",
    )
    serve.add_argument("--api-key-file", help="read the api key from this file (its first line)")
    serve.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME[:PORT]",
        help="another Host header to serve besides the bound address (repeat); any other is a 403",
    )
    serve.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin allowed to call, e.g. https://app.example (repeat); by default none",
    )
    serve.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="run N gateway processes behind the address (POST /rollouts answers with a worker's base_url), one "
        "merged output written by a supervisor, a write-ahead journal per worker (docs/scaling.md)",
    )
    serve.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the --workers as Ray actors on this Ray cluster ('auto': the one this machine runs; needs "
        'pip install "tito-core[ray]"; docs/scaling.md)',
    )
    serve.add_argument(
        "--journal-fsync",
        action="store_true",
        help="with --workers: sync each worker's journal line to the disk before its answer goes out (answered calls "
        "then survive a power cut too, not only a killed process; one disk flush per call, docs/scaling.md)",
    )
    serve.add_argument("--idle-timeout", type=float, default=600.0, help="seconds before an idle rollout ends")
    serve.add_argument(
        "--drain-s",
        type=float,
        default=30.0,
        help="at SIGINT/SIGTERM, seconds the calls in flight get to finish (recorded, then answered) before they "
        "are cancelled",
    )


def run_serve(args: argparse.Namespace) -> int:
    """Run ``tito serve``; returns the exit status."""
    from ..errors import ConfigError
    from ..gateway.server import api_key_from, serve
    from ..runner.interrupts import run_interruptible
    from ..runner.run import prepare_config

    logging.basicConfig(level=logging.WARNING, format="tito: %(message)s")
    api_key = api_key_from(args.api_key, args.api_key_file)  # a bad key is an error before any work
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers must be 1 or more, got {args.workers}")
    if args.ray is not None and args.workers is None:
        raise ConfigError("--ray runs the gateway's workers on Ray: give how many with --workers N")
    if args.journal_fsync and args.workers is None:
        raise ConfigError("--journal-fsync syncs the journals of --workers N; one gateway process keeps no journal")

    async def prepared_then_served() -> int:
        # as `tito rollout` does: the config's `rollout.prepare` hook (which may build the model and set
        # `tokenizer`, `backend_options.model_path`, `chat_template`) runs before the backend is built
        config, _ = await prepare_config(args.config, {})
        options = {
            "output": args.output,
            "api_key": api_key,
            "idle_timeout": args.idle_timeout,
            "drain_s": args.drain_s,
            "allow_hosts": args.allow_host,
            "allow_origins": args.allow_origin,
        }
        if args.workers is not None:
            from ..gateway.scale_out import serve_workers

            options["journal_fsync"] = args.journal_fsync
            return await serve_workers(config, args.workers, host=args.host, port=args.port, ray=args.ray, **options)
        return await serve(config, host=args.host, port=args.port, **options)

    # Ctrl-C before the gateway serves (a prepare hook building a model) reaches main; it handles SIGINT after
    return run_interruptible(prepared_then_served())
