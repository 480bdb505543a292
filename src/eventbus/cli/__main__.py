"""``python -m eventbus.cli``: the ``eventbus`` command without the installed script."""

from __future__ import annotations

from eventbus.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
