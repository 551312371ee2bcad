"""slime's router as an SGLang backend: one pooled client per process, sized from slime's arguments.

slime's generate hook (:func:`tito_core.trainers.slime.run_agent`) runs the agent on the backend this module
builds; the hook lives with the trainer integrations in tito-core, so this adapter imports no front.
"""

from __future__ import annotations

import functools
from typing import Any

from .backend import SGLangBackend

__all__ = ["backend_from_slime_args"]


@functools.cache
def _backend_for(url_key: tuple[str, int, int | None, int | None, int | None, str | None]) -> SGLangBackend:
    ip, port, concurrency, gpus, per_engine, checkpoint = url_key

    class _Args:
        sglang_router_ip = ip
        sglang_router_port = port
        sglang_server_concurrency = concurrency
        rollout_num_gpus = gpus
        rollout_num_gpus_per_engine = per_engine
        hf_checkpoint = checkpoint

    return SGLangBackend.from_slime_args(_Args())


def backend_from_slime_args(args: Any) -> SGLangBackend:
    """The process-wide backend for slime's router (one pooled client shared by every sample)."""
    key = (
        str(args.sglang_router_ip),
        int(args.sglang_router_port),
        getattr(args, "sglang_server_concurrency", None),
        getattr(args, "rollout_num_gpus", None),
        getattr(args, "rollout_num_gpus_per_engine", None),
        getattr(args, "hf_checkpoint", None),
    )
    return _backend_for(key)
