"""``tito serve --workers N [--ray ADDRESS]``: a worker pool served until a signal.

The pool is :class:`~tito_core.gateway.workers.WorkerPool` (processes) or
:class:`~tito_core.gateway.ray_workers.RayWorkerPool` (Ray actors).
"""

from __future__ import annotations

import sys
from typing import Any

from ..config import TitoConfig
from .ray_workers import RayWorkerPool
from .server import stop_on_signals
from .workers import WorkerPool

__all__ = ["serve_workers"]


async def serve_workers(config: TitoConfig, workers: int, *, host: str = "127.0.0.1", port: int = 8100,
                        ray: str | None = None, **options: Any) -> int:  # fmt: skip
    """``tito serve --workers N``: serve until SIGINT / SIGTERM, drain every worker, return the exit status (0).

    ``ray``: the Ray cluster's address, to run the workers as Ray actors
    (:class:`~tito_core.gateway.ray_workers.RayWorkerPool`). ``options`` are :class:`WorkerPool`'s (``output``,
    ``api_key``, ``idle_timeout``, ``drain_s``, ...).
    """
    if ray is not None:
        pool: WorkerPool = RayWorkerPool(config, workers, address=ray, **options)
    else:
        pool = WorkerPool(config, workers, **options)
    with stop_on_signals(pool.signal_workers) as stop:  # a second signal: the workers stop waiting for calls
        try:
            base = await pool.start(host, port)
        except BaseException:
            await pool.close()
            raise
        print(f"tito serve: serving on {base}", flush=True)
        for worker in pool.workers:
            print(f"tito serve: worker {worker.index} on {worker.base_url} (pid {worker.pid})", flush=True)
        key = "<the api key>" if pool.access.api_key else pool.access.viewer_key
        print(f"tito serve: each worker's viewer at <its address>/ui/#key={key}", flush=True)
        await stop.wait()
        drain = pool.settings.drain_s
        said = (f"tito serve: shutting down; {len(pool.workers)} workers drain their calls (up to {drain:g} s; a "
                "second Ctrl-C: stop waiting), then open rollouts are written as aborted")  # fmt: skip
        print(said, file=sys.stderr, flush=True)
        pool.signal_workers()
        await pool.close()
    return 0
