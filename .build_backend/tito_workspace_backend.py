"""In-tree PEP 517 build backend of the repository root, which is a workspace and not a package.

Every hook fails with a message naming what to install instead, so ``pip install -e .`` (or ``pip install .``,
``python -m build``, ``uv pip install -e .``) at the root says what to run rather than installing something
else. The packages are in ``packages/`` (and the example adapter in ``examples/tito-backend-echo``).
"""

from __future__ import annotations

from typing import Any, NoReturn

INSTALL = (
    "python3 -m pip install -e packages/tito-core -e packages/tito-testing -e packages/tito-vllm"
    " -e packages/tito-sglang -e packages/tito-transformers"
)
MESSAGE = f"""
The root of the tito repository is a workspace, not a package: there is nothing to install here.
The packages live in packages/. From the repository root, install core and the adapters editable with:

    {INSTALL}

or only what you need (e.g. python3 -m pip install -e packages/tito-core), or run the test suite with
`python3 -m pip install nox uv && python3 -m nox`.
"""


def _refuse(*_args: Any, **_kwargs: Any) -> NoReturn:
    # SystemExit, not an exception: the front end (pip, build, uv) shows the message without a traceback.
    raise SystemExit(MESSAGE)


# The hooks pip, build and uv call first (requirements), then the builds themselves.
get_requires_for_build_wheel = get_requires_for_build_sdist = get_requires_for_build_editable = _refuse
prepare_metadata_for_build_wheel = prepare_metadata_for_build_editable = _refuse
build_wheel = build_sdist = build_editable = _refuse
