"""SGLang adapter for tito: token ids in, token ids and logprobs out, through SGLang's native ``/generate``.

``pip install tito-core[sglang]`` makes the backend available by name (``"sglang"``) through the ``tito``
plugin entry point; it can also be built directly::

    from tito_sglang import SGLangBackend

    backend = SGLangBackend("http://127.0.0.1:30000")

The backend module is imported on first use, so discovering plugins stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tito_sglang._sessions import SGLangSessionError
    from tito_sglang.backend import SGLangBackend

__all__ = ["SGLangBackend", "SGLangSessionError"]


def __getattr__(name: str) -> Any:
    if name == "SGLangBackend":
        from tito_sglang.backend import SGLangBackend

        return SGLangBackend
    if name == "SGLangSessionError":
        from tito_sglang._sessions import SGLangSessionError

        return SGLangSessionError
    raise AttributeError(f"module 'tito_sglang' has no attribute {name!r}")
