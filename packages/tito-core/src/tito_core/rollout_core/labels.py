"""Lineage labels: the optional name a client gives a call's lineage (``X-Tito-Lineage``, Strands' ``tito_lineage``).

A label is 1 to :data:`MAX_LABEL` characters of ``A-Z a-z 0-9 . _ : / @ -``, starting with a letter or digit
(``parent``, ``sub-agent/2``). It may carry one parameter, ``; compaction``: the call continues a lineage from a
summary (a compaction). Without a label the tree is built from tokens alone; with one, a call goes on no branch
labelled otherwise (:class:`~tito_core.rollout_core.lineages.Lineages`).
"""

from __future__ import annotations

import re

import msgspec

from ..errors import LineageLabelError

__all__ = ["LABEL_HEADER", "MAX_LABEL", "Label", "parse_label"]

LABEL_HEADER = "X-Tito-Lineage"
"""The gateway's request header that labels a call's lineage, read on every front's call routes."""

MAX_LABEL = 64
"""The longest label taken, in characters."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@-]*")
_PARAMETERS = frozenset({"compaction"})


class Label(msgspec.Struct, frozen=True, gc=False):
    """A call's lineage label: its ``name``, and whether the call continues a lineage from a summary."""

    name: str
    compaction: bool = False


def parse_label(value: str | None, where: str = LABEL_HEADER) -> Label | None:
    """The label ``value`` gives (None for None or blank), ``NAME`` or ``NAME; compaction``.

    Raises:
        LineageLabelError: ``value`` is no label (too long, another character, an unknown parameter), naming
            ``where`` the caller wrote it.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise LineageLabelError(f"{where}: a lineage label is a string, got {type(value).__name__}")
    name, _, rest = value.partition(";")
    name, parameter = name.strip(), rest.strip().lower()
    if not name and not rest:
        return None
    if len(name) > MAX_LABEL or not _NAME.fullmatch(name):
        shown = name[:MAX_LABEL] + ("..." if len(name) > MAX_LABEL else "")
        raise LineageLabelError(
            f"{where}: {shown!r} is not a lineage label: 1 to {MAX_LABEL} characters of A-Z a-z 0-9 . _ : / @ -, "
            f"starting with a letter or a digit (got {len(name)} characters)"
        )
    if rest and parameter not in _PARAMETERS:
        raise LineageLabelError(
            f"{where}: unknown lineage label parameter {rest.strip()[:32]!r}; the one taken is '; compaction'"
        )
    return Label(name, compaction=bool(rest))
