"""A griffe extension for the docs site: Sphinx cross-reference roles in docstrings become site links.

The docstrings write references the Sphinx way (:class:`~tito_core.trajectory.Trajectory`,
:meth:`reset`); mkdocstrings would print the role literally. After a package is loaded, each role is
rewritten to an mkdocs-autorefs link, ``[`Trajectory`][tito_core.trajectory.Trajectory]``, with relative
names resolved in the docstring's own scope, so that a reference to something the site does not document
fails the strict build instead of rendering as dead text. Two exceptions: a private target (a ``_`` name,
which the site never shows) stays plain code, and an attribute with no docstring of its own (a field
documented in its class's ``Attributes:`` section) links to its class. A reST literal-block marker
(``built directly::`` before an indented block, which Markdown already shows as code) becomes a colon.
Used by mkdocs.yml only; not shipped.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(class|func|meth|attr|exc|data|mod|obj):`(~?)([\w.]+)(\(\))?`")
CALLABLE = {"func", "meth"}
LITERAL_BLOCK = re.compile(r"(\S?)[ \t]*::$(?=\n[ \t]*\n)", re.MULTILINE)


def _rewrite(text: str, scope: griffe.Object, loader: griffe.GriffeLoader) -> str:
    def link(match: re.Match[str]) -> str:
        role, short, target, _ = match.groups()
        title = f"`{target.rsplit('.', 1)[-1] if short else target}{'()' if role in CALLABLE else ''}`"
        head, _, rest = target.partition(".")
        try:
            path = scope.resolve(head) + (f".{rest}" if rest else "")
        except griffe.NameResolutionError:
            path = target  # already a full path (or unknown: then autorefs reports it)
        if any(part.startswith("_") for part in path.split(".")):
            return title
        try:
            obj = loader.modules_collection[path]
        except (KeyError, ValueError, AttributeError):
            obj = None
        if obj is not None and not obj.is_alias and obj.is_attribute and obj.docstring is None and obj.parent:
            path = obj.parent.path
        return f"[{title}][{path}]"

    text = ROLE.sub(link, text)
    return LITERAL_BLOCK.sub(lambda m: f"{m.group(1)}:" if m.group(1) else "", text)


def _objects(obj: griffe.Object) -> list[griffe.Object]:
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            found.extend(_objects(member))  # type: ignore[arg-type]
    return found


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring of a loaded package into autorefs links."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Called by griffe once a whole package is loaded: every name a docstring uses is resolvable now."""
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = _rewrite(obj.docstring.value, obj, loader)
