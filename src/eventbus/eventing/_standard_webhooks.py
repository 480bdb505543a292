"""The Standard Webhooks signature scheme (standardwebhooks.com), beside EventBus's own HMAC v2.

A signed request carries three headers:

* ``webhook-id``: the message's id, the same on every retry of it (the receiver's idempotency
  key);
* ``webhook-timestamp``: the signing time in unix seconds;
* ``webhook-signature``: space-separated ``v1,<base64 HMAC-SHA256>`` signatures (several during
  a secret rotation) of ``<webhook-id>.<webhook-timestamp>.<body>``.

The secret is ``whsec_`` followed by the base64 of the key bytes (the prefix is optional); the
HMAC key is the decoded bytes. Unlike HMAC v2 the signature covers only the id, the time and
the body, not the method, path, query or ``ce-*`` headers; the senders and receivers of every
language's Standard Webhooks library speak it. Asymmetric ``v1a`` signatures are not
supported. The gateway verifies it on an HTTP source with
``auth: {standard_webhooks: {secret_env: ...}}``; the HTTP sink signs with it under
``auth: {standard_webhooks: {secret: ...}}``.

Example:
    >>> key = decode_secret("whsec_" + "c2VjcmV0LWtleS0xMjM0NQ==", "example")
    >>> h = webhook_headers(key, b'{"a": 1}', msg_id="msg_1", timestamp=1700000000)
    >>> verify_webhook(key, h, b'{"a": 1}', now=1700000000) == (1700000000, h["webhook-signature"][3:])
    True
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
from collections.abc import Iterable, Mapping

__all__ = [
    "ID_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "decode_secret",
    "message_id",
    "sign_webhook",
    "verify_webhook",
    "webhook_headers",
]

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
#: Most signatures one header may carry (several during a secret rotation).
MAX_SIGNATURES = 8
#: Longest ``webhook-id`` taken (it is signed and hashed into the replay key: no megabytes).
MAX_ID_CHARS = 256
_PREFIX = "whsec_"
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_FORMAT = (
    f"{ID_HEADER}: <message id>, {TIMESTAMP_HEADER}: <unix seconds>, "
    f"{SIGNATURE_HEADER}: v1,<base64 HMAC-SHA256 of '<id>.<timestamp>.<body>'>"
)


def decode_secret(secret: str, where: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret (``whsec_<base64>``, prefix optional).

    Args:
        secret: the secret as configured.
        where: what holds it, for the message (never the value).

    Raises:
        ValueError: the secret is not base64 or decodes to nothing.
    """
    text = secret.strip().removeprefix(_PREFIX)
    try:
        # padding may be left out, as the reference libraries allow
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if not key:
        msg = (
            f"{where} is not a Standard Webhooks secret: write 'whsec_' followed by the base64 "
            'of at least 24 random bytes (e.g. python -c "import base64, os; '
            "print('whsec_' + base64.b64encode(os.urandom(32)).decode())\")"
        )
        raise ValueError(msg)
    return key


def message_id(keys: Iterable[str]) -> str:
    """A ``webhook-id`` for a request carrying the events of ``keys`` (their ``source`` and
    ``id``): the same on every retry of that request, so the receiver can drop repeats."""
    digest = hashlib.sha256()
    for key in keys:
        digest.update(key.encode("utf-8", "surrogateescape") + b"\n")
    return f"msg_{digest.hexdigest()[:32]}"


def sign_webhook(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The base64 HMAC-SHA256 of ``<msg_id>.<timestamp>.<body>`` (without the ``v1,``)."""
    signed = f"{msg_id}.{timestamp}.".encode("utf-8", "surrogateescape") + body
    return base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def webhook_headers(
    key: bytes, body: bytes, *, msg_id: str, timestamp: int | None = None
) -> dict[str, str]:
    """The three headers of a request signed with ``key``.

    Args:
        key: the HMAC key (:func:`decode_secret` of the secret).
        body: the exact request body.
        msg_id: the message's id: the same on every retry of one message.
        timestamp: the signing time in unix seconds (default: now).
    """
    t = int(time.time()) if timestamp is None else timestamp
    return {
        ID_HEADER: msg_id,
        TIMESTAMP_HEADER: str(t),
        SIGNATURE_HEADER: f"v1,{sign_webhook(key, msg_id, t, body)}",
    }


def verify_webhook(
    key: bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float,
    tolerance_s: int = 300,
) -> tuple[int, str] | str | None:
    """Check a request's Standard Webhooks headers against one key.

    Args:
        key: the HMAC key (:func:`decode_secret` of the secret).
        headers: the request headers (lower-case names).
        body: the exact request body.
        now: the current time in unix seconds.
        tolerance_s: the replay window.

    Returns:
        ``(timestamp, matching signature)`` when a ``v1`` signature matches; a reason (for the
        caller) when a header is missing or malformed or the timestamp is outside the window;
        None when no signature matches.
    """
    msg_id = headers.get(ID_HEADER)
    t = headers.get(TIMESTAMP_HEADER)
    value = headers.get(SIGNATURE_HEADER)
    if not msg_id or not t or not value:
        missing = [
            n
            for n, v in ((ID_HEADER, msg_id), (TIMESTAMP_HEADER, t), (SIGNATURE_HEADER, value))
            if not v
        ]
        return f"missing header {', '.join(missing)}; send {_FORMAT}"
    if len(msg_id) > MAX_ID_CHARS:
        return f"header {ID_HEADER} has {len(msg_id)} characters; send at most {MAX_ID_CHARS}"
    if not _TIMESTAMP.fullmatch(t):
        return (
            f"header {TIMESTAMP_HEADER} must be unix seconds in 1 to 12 ASCII digits "
            f"(got {len(t)} characters)"
        )
    items = value.split(" ", MAX_SIGNATURES + 1)
    if len(items) > MAX_SIGNATURES:
        return f"header {SIGNATURE_HEADER} carries more than {MAX_SIGNATURES} signatures; send one (two during a secret rotation)"
    sigs = [s for version, _, s in (i.partition(",") for i in items) if version == "v1" and s]
    if not sigs:
        return (
            f"header {SIGNATURE_HEADER} carries no 'v1,<base64>' signature (asymmetric v1a "
            f"signatures are not supported); send {_FORMAT}"
        )
    ts = int(t)
    if abs(now - ts) > tolerance_s:
        return f"the signature's timestamp is outside the {tolerance_s} s replay window; sign the request again with the current time"
    expected = sign_webhook(key, msg_id, ts, body).encode()
    match: str | None = None
    for s in sigs:
        # bytes: compare_digest refuses str with non-ASCII characters (a 500, not a 401)
        if hmac.compare_digest(expected, s.encode("utf-8", "surrogateescape")):
            match = s
    return None if match is None else (ts, match)
