"""Headroom for code that walks documents by recursion (JSONata, JSON Schema validation).

Python 3.11 runs Python-to-Python calls without growing the C stack, so the interpreter's
recursion limit may be raised safely; each caller bounds the depth it walks (orjson parses at
most 1024 levels, JSONata has its own budget). The limit is process-wide: every walker raises it
to the same value, so an answer never depends on which of them ran first.
"""

from __future__ import annotations

import sys

RECURSION_LIMIT = 20_000


def ensure_headroom() -> None:
    """Raise the interpreter's recursion limit to :data:`RECURSION_LIMIT` (never lowers it).

    Example:
        >>> ensure_headroom(); sys.getrecursionlimit() >= RECURSION_LIMIT
        True
    """
    if sys.getrecursionlimit() < RECURSION_LIMIT:
        sys.setrecursionlimit(RECURSION_LIMIT)
