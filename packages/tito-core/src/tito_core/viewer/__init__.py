"""``tito view``: a read-only web viewer of rollouts, for a rollout file and for the gateway's live ones (``/ui``).

Modules, one job each:

* :mod:`~tito_core.viewer.pages`: what the pages show, as plain data (a row per record; a record token by token);
* :mod:`~tito_core.viewer.source`: where the rollouts come from (:class:`Source`; a rollout file);
* :mod:`~tito_core.viewer.app`: the aiohttp app serving the page, its script and style, and the JSON API.

The page is one HTML file, one script and one style sheet shipped in the package: nothing is fetched from
elsewhere, and its two charts are SVG drawn by that script.
"""

from __future__ import annotations

from .app import browser_rules, viewer_app
from .pages import TokenTexts, record_fields, record_view, run_row
from .source import FileSource, Source, runs_page

__all__ = [
    "FileSource",
    "Source",
    "TokenTexts",
    "browser_rules",
    "record_fields",
    "record_view",
    "run_row",
    "runs_page",
    "viewer_app",
]
