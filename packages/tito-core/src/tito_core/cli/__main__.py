"""``python -m tito_core.cli``: the ``tito`` command."""

from tito_core.cli import main

raise SystemExit(main())
