"""The HMAC-SHA256 signature scheme of HTTP requests (Stripe's header, a canonical request).

A signed request carries ``t=<unix seconds>,v2=<hex HMAC-SHA256 of the canonical request>``
in a header (:data:`SIGNATURE_HEADER` by default). The canonical request is these lines, each
ended by ``\\n``, then the exact body bytes::

    <t>                       the timestamp, as in the header (ASCII digits)
    <METHOD>                  upper case, e.g. POST
    <path>                    percent-encoded (urllib.parse.quote(unquote(path), safe="/"))
    <query>                   its pairs sorted, re-encoded (urlencode(sorted(parse_qsl(
                              query, keep_blank_values=True)), quote_via=quote)); may be empty
    <content-type>            the header's value, surrounding whitespace stripped; may be empty
    <name>:<value>            one line per ce-* header, names lower case and sorted, values
                              stripped (none when the request has no ce-* header)
                              an empty line
    <body>

so a captured request replayed with another ``ce-type``, another path or ``?wait=true`` no
longer matches. A signature whose timestamp is older or newer than the tolerance is refused
(the replay window); within the window the gateway accepts each signature once (its replay
cache). :func:`sign` and :func:`sign_request` compute the header value; the gateway checks it
with :func:`verify_signature` (which secret guards which route is the gateway's policy,
``eventbus.gateway``). Comparisons are constant time (``hmac.compare_digest``).

Example:
    >>> body = b'{"amount": 5}'
    >>> headers = {"content-type": "application/json", "ce-type": "payment.created"}
    >>> value = sign_request(b"k", "POST", "http://gw/payments?wait=true", headers, body)
    >>> verify_signature(
    ...     b"k", value, body, now=int(value[2:12]), path="/payments", query="wait=true",
    ...     headers=headers,
    ... ) is not None
    True
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Mapping
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

__all__ = [
    "DEFAULT_TOLERANCE_S",
    "SIGNATURE_HEADER",
    "canonical_request",
    "check_signature",
    "sign",
    "sign_request",
    "verify_signature",
]

#: The header a signature travels in unless configured otherwise.
SIGNATURE_HEADER = "x-eventbus-signature"
#: The replay window in seconds unless configured otherwise.
DEFAULT_TOLERANCE_S = 300
#: Most signatures one header may carry (several during a secret rotation).
MAX_SIGNATURES = 8

# ASCII digits only (str.isdigit() also takes '²' and other scripts' digits), at most 12 of
# them (unix seconds until the year 33658): int() of anything longer is work for nothing.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_FORMAT = "t=<unix seconds>,v2=<hex HMAC-SHA256 of the canonical request>"


def _canonical_path(path: str) -> str:
    return quote(unquote(path), safe="/")


def _canonical_query(query: str) -> str:
    if not query:
        return ""
    pairs = sorted(parse_qsl(query, keep_blank_values=True))
    return urlencode(pairs, quote_via=quote)


def canonical_request(
    *,
    timestamp: int | str,
    method: str,
    path: str,
    query: str,
    headers: Mapping[str, str],
    body: bytes,
) -> bytes:
    """The bytes a signature covers (the form is in this module's docstring).

    Args:
        timestamp: the signing time in unix seconds, as it appears in the header.
        method: the HTTP method.
        path: the request path (percent-encoded or not: it is normalised).
        query: the query string without ``?`` (may be empty).
        headers: the request headers; only ``content-type`` and ``ce-*`` are covered (names
            in any case).
        body: the exact request body.

    Returns:
        The canonical request.
    """
    content_type = ""
    ce: list[tuple[str, str]] = []
    for name, value in headers.items():
        low = name.lower()
        if low == "content-type":
            content_type = value.strip()
        elif low.startswith("ce-"):
            ce.append((low, value.strip()))
    ce.sort()
    lines = [
        str(timestamp),
        method.upper(),
        _canonical_path(path),
        _canonical_query(query),
        content_type,
        *(f"{k}:{v}" for k, v in ce),
        "",
    ]
    return "\n".join(lines).encode("utf-8", "surrogateescape") + b"\n" + body


def _mac(key: bytes, canonical: bytes) -> str:
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def sign(
    secret: bytes | str,
    body: bytes,
    *,
    path: str,
    method: str = "POST",
    query: str = "",
    headers: Mapping[str, str] | None = None,
    timestamp: int | None = None,
) -> str:
    """The signature header value of a request: ``t=<unix seconds>,v2=<hex HMAC-SHA256>``.

    Send the request with exactly the ``content-type`` and ``ce-*`` headers given here.

    Args:
        secret: the shared secret.
        body: the exact request body.
        path: the request path, e.g. ``/v1/pipelines/orders/events``.
        method: the HTTP method.
        query: the query string without ``?`` (e.g. ``wait=true``).
        headers: the request's headers (``content-type`` and ``ce-*`` are signed).
        timestamp: the signing time in unix seconds (default: now).

    Returns:
        The header value.

    Example:
        >>> sign(b"s3cret", b"{}", path="/payments", timestamp=1700000000)[:15]
        't=1700000000,v2'
    """
    key = secret.encode() if isinstance(secret, str) else secret
    t = int(time.time()) if timestamp is None else timestamp
    canonical = canonical_request(
        timestamp=t, method=method, path=path, query=query, headers=headers or {}, body=body
    )
    return f"t={t},v2={_mac(key, canonical)}"


def sign_request(
    secret: bytes | str,
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    timestamp: int | None = None,
) -> str:
    """:func:`sign` for a request given by its URL (path and query taken from it).

    Args:
        secret: the shared secret.
        method: the HTTP method.
        url: the full URL (``http://host:port/path?query``) or a path with its query.
        headers: the request's headers (``content-type`` and ``ce-*`` are signed).
        body: the exact request body.
        timestamp: the signing time in unix seconds (default: now).

    Returns:
        The header value.

    Example:
        >>> sign_request("k", "POST", "http://gw/hooks?wait=true", {}, b"{}", timestamp=1)[:4]
        't=1,'
    """
    parts = urlsplit(url)
    return sign(
        secret,
        body,
        path=parts.path or "/",
        method=method,
        query=parts.query,
        headers=headers,
        timestamp=timestamp,
    )


def verify_signature(
    secret: bytes,
    value: str,
    body: bytes,
    *,
    now: float,
    method: str = "POST",
    path: str,
    query: str = "",
    headers: Mapping[str, str],
    tolerance_s: int = DEFAULT_TOLERANCE_S,
    header: str = SIGNATURE_HEADER,
) -> tuple[int, str] | str | None:
    """Check one signature header value against one secret.

    Args:
        secret: the shared secret.
        value: the header's value (``t=...,v2=...``; up to :data:`MAX_SIGNATURES` ``v2``, as
            during a secret rotation: any one matching is enough).
        body: the exact request body.
        now: the current time in unix seconds.
        method: the request's HTTP method.
        path: the request path.
        query: the query string without ``?``.
        headers: the request headers (lower-case names).
        tolerance_s: the replay window.
        header: the header's name (only for the messages).

    Returns:
        ``(timestamp, matching signature)`` when a signature matches; a reason (for the
        caller) when the value is malformed or its timestamp is outside the window; None when
        no signature matches.
    """
    t: str | None = None
    sigs: list[str] = []
    old = False
    for part in value.split(",", MAX_SIGNATURES + 2):
        k, _, v = part.strip().partition("=")
        if k == "t":
            t = v
        elif k == "v2":
            sigs.append(v)
        elif k == "v1":
            old = True
    if t is None or not sigs:
        if old and t is not None:
            return (
                f"header {header} carries only v1 signatures (of the body alone), which are no "
                f"longer accepted; send {_FORMAT} (eventbus.eventing.sources.sign computes it)"
            )
        return f"header {header} must be '{_FORMAT}'"
    if not _TIMESTAMP.fullmatch(t):
        return (
            f"the timestamp t= in header {header} must be unix seconds in 1 to 12 ASCII digits "
            f"(got {len(t)} characters); send '{_FORMAT}'"
        )
    if len(sigs) > MAX_SIGNATURES:
        return f"header {header} carries more than {MAX_SIGNATURES} v2 signatures; send one (two during a secret rotation)"
    ts = int(t)
    if abs(now - ts) > tolerance_s:
        return f"the signature's timestamp is outside the {tolerance_s} s replay window; sign the request again with the current time"
    canonical = canonical_request(
        timestamp=t, method=method, path=path, query=query, headers=headers, body=body
    )
    expected = _mac(secret, canonical).encode()
    match: str | None = None
    for s in sigs:
        # bytes: compare_digest refuses str with non-ASCII characters (a 500, not a 401)
        if hmac.compare_digest(expected, s.encode("utf-8", "surrogateescape")):
            match = s
    return None if match is None else (ts, match)


def check_signature(
    secret: bytes,
    value: str,
    body: bytes,
    *,
    now: float,
    method: str = "POST",
    path: str,
    query: str = "",
    headers: Mapping[str, str],
    tolerance_s: int = DEFAULT_TOLERANCE_S,
    header: str = SIGNATURE_HEADER,
) -> bool | str:
    """:func:`verify_signature` as True (a signature matches), a reason, or False.

    Example:
        >>> check_signature(
        ...     b"k", sign(b"k", b"{}", path="/p", timestamp=100), b"{}", now=100, path="/p",
        ...     headers={},
        ... )
        True
    """
    got = verify_signature(
        secret,
        value,
        body,
        now=now,
        method=method,
        path=path,
        query=query,
        headers=headers,
        tolerance_s=tolerance_s,
        header=header,
    )
    if isinstance(got, str):
        return got
    return got is not None
