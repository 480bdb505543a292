"""The HMAC-SHA256 signature scheme of HTTP requests, as Stripe signs webhooks.

A signed request carries ``t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`` in a
header (:data:`SIGNATURE_HEADER` by default); a signature older or newer than the tolerance is
refused (replay window). The gateway checks callers' signatures with it (which secret guards
which route is the gateway's policy, ``eventbus.gateway``), and an HTTP sink signs the requests
it sends the same way. Comparisons are constant time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hashlib
import hmac
import time

__all__ = ["DEFAULT_TOLERANCE_S", "SIGNATURE_HEADER", "check_signature", "sign"]

#: The header a signature travels in unless configured otherwise.
SIGNATURE_HEADER = "x-eventbus-signature"
#: The replay window in seconds unless configured otherwise.
DEFAULT_TOLERANCE_S = 300


def sign(secret: bytes | str, body: bytes, timestamp: int | None = None) -> str:
    """The signature header value for ``body``: ``t=<unix seconds>,v1=<hex HMAC-SHA256>``.

    Args:
        secret: the shared secret.
        body: the exact request body.
        timestamp: the signing time in unix seconds (default: now).

    Returns:
        The header value.

    Example:
        >>> sign(b"s3cret", b"{}", timestamp=1700000000)[:15]
        't=1700000000,v1'
    """
    key = secret.encode() if isinstance(secret, str) else secret
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(key, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def check_signature(
    secret: bytes,
    value: str,
    body: bytes,
    *,
    now: float,
    tolerance_s: int = DEFAULT_TOLERANCE_S,
    header: str = SIGNATURE_HEADER,
) -> bool | str:
    """Check one signature header value against one secret.

    Args:
        secret: the shared secret.
        value: the header's value (``t=...,v1=...``; several ``v1`` are allowed, as during a
            secret rotation: any one matching is enough).
        body: the exact request body.
        now: the current time in unix seconds.
        tolerance_s: the replay window.
        header: the header's name (only for the message).

    Returns:
        True when a signature matches; a reason (for the caller) when the value is malformed
        or its timestamp is outside the window; False when no signature matches.

    Example:
        >>> check_signature(b"k", sign(b"k", b"{}", timestamp=100), b"{}", now=100)
        True
    """
    t: str | None = None
    sigs: list[str] = []
    for part in value.split(","):
        k, _, v = part.strip().partition("=")
        if k == "t":
            t = v
        elif k == "v1":
            sigs.append(v)
    if t is None or not t.isdigit() or not sigs:
        return f"header {header} must be 't=<unix seconds>,v1=<hex HMAC-SHA256 of \"<t>.<body>\">'"
    if abs(now - int(t)) > tolerance_s:
        return f"the signature's timestamp is outside the {tolerance_s} s replay window; sign the request again with the current time"
    expected = hmac.new(secret, t.encode() + b"." + body, hashlib.sha256).hexdigest()
    ok = False
    for s in sigs:
        ok |= hmac.compare_digest(expected, s)
    return ok
