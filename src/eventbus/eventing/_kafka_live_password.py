"""A Kafka SASL password that follows its reference while the clients run: a rotated
``{secret: NAME}`` (or ``{file: PATH}``) takes effect without restarting anything.

aiokafka logs in once per connection, with the password its client holds. Every long-lived
client (a source's consumers and producers, a sink's producer) is attached with
:func:`follow_password`; the password of every client attached for the same reference is then
kept equal to the reference's current value:

* at most once per :data:`REFRESH_S`, from the owner's own loop (:func:`refresh`: the source's
  fetch, the sink's send), so a secret rotated before the broker's credential is used by the
  next login without a refused one;
* at once when the broker refuses a login (the credential was rotated on the broker first):
  the reference is read again and aiokafka's retry logs in with the new value. Each refusal is
  counted (``sasl_logins_refused`` in the source's stats) and logged as an error naming the
  user, the reference and the fix, never a value.

Connections already logged in stay up (Kafka keeps them unless the broker sets
``connections.max.reauth.ms``); the new password is used by each new connection. Nothing is
rebuilt and no record is re-read, so rotation is outside the delivery contract entirely.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from eventbus.errors import ConfigError
from eventbus.eventing._aiokafka_adapter import kafka_client_of, on_login_refused, set_sasl_password

if TYPE_CHECKING:
    from eventbus.eventing._kafka_client import KafkaClientConfig

__all__ = ["RECENT_S", "REFRESH_S", "follow_password", "login_stats", "refresh"]

log = logging.getLogger("eventbus.eventing.kafka")

#: Longest a rotated reference waits to be read again while logins succeed (seconds).
REFRESH_S = 1.0
#: Least time between two error lines about refused logins of one user (seconds).
_LOG_EVERY_S = 30.0
#: Refused logins this recent count in ``sasl_logins_refused_recent`` (a pipeline's status
#: is DEGRADED while it is above 0: see ``observability._view.mark_refused_logins``).
RECENT_S = 60.0


class _LivePassword:
    """One reference's current value and the clients that log in with it (in this process)."""

    def __init__(self, config: KafkaClientConfig) -> None:
        sasl = config.sasl
        assert sasl is not None and sasl.password is not None
        self.ref = sasl.password
        self.username = sasl.username
        self.mechanism = sasl.mechanism
        self.value: str | None = None
        self.refused = 0
        self.changes = 0
        self._refusals: collections.deque[float] = collections.deque(maxlen=10_000)
        self._lock = threading.Lock()
        self._clients: weakref.WeakSet[Any] = weakref.WeakSet()
        self._read_at = 0.0
        self._logged_at = -_LOG_EVERY_S
        self._unreadable_at = -_LOG_EVERY_S

    def attach(self, owner: Any) -> None:
        client = kafka_client_of(owner)
        if client is None:
            return
        self.refresh(force=True)
        with self._lock:
            self._clients.add(client)
            if self.value is not None:
                set_sasl_password(client, self.value)
        on_login_refused(client, self._login_refused)

    def refresh(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._read_at < REFRESH_S:
            return
        self._read_at = now
        try:
            value = self.ref.resolve("kafka sasl.password")
        except ConfigError as e:  # deleted or unreadable: keep logging in with the last value
            if now - self._unreadable_at >= _LOG_EVERY_S:
                self._unreadable_at = now
                log.warning("%s; Kafka logins keep the password read before", e)
            return
        with self._lock:
            if value == self.value:
                return
            if self.value is not None:
                self.changes += 1
                log.info(
                    "kafka: the SASL password of user %r (%s) changed: new connections log in "
                    "with it",
                    self.username,
                    self.ref.describe(),
                )
            self.value = value
            for client in list(self._clients):
                set_sasl_password(client, value)

    def recent(self) -> int:
        """Logins refused in the last :data:`RECENT_S` seconds."""
        since = time.monotonic() - RECENT_S
        with self._lock:
            while self._refusals and self._refusals[0] < since:
                self._refusals.popleft()
            return len(self._refusals)

    def _login_refused(self) -> None:
        self.refused += 1
        now = time.monotonic()
        with self._lock:
            self._refusals.append(now)
        if now - self._logged_at >= _LOG_EVERY_S:
            self._logged_at = now
            fix = (
                f"store the broker's new password with `eventbus secret set {self.ref.secret}`"
                if self.ref.secret is not None
                else f"put the broker's new password in {self.ref.describe()}"
            )
            log.error(
                "kafka: the broker refused the SASL %s login of user %r (%d refused so far): "
                "the password from %s is not the broker's; %s, it is read again at the next "
                "login (no restart needed)",
                self.mechanism,
                self.username,
                self.refused,
                self.ref.describe(),
                fix,
            )
        self.refresh(force=True)


_lock = threading.Lock()
_live: dict[tuple[str | None, str, Any], _LivePassword] = {}


def _live_for(config: KafkaClientConfig | None) -> _LivePassword | None:
    if config is None or config.sasl is None or config.sasl.password is None:
        return None
    if config.security_protocol == "PLAINTEXT":
        return None
    sasl = config.sasl
    key = (sasl.username, sasl.mechanism, sasl.password)
    with _lock:
        live = _live.get(key)
        if live is None:
            live = _live[key] = _LivePassword(config)
        return live


def follow_password(owner: Any, config: KafkaClientConfig | None) -> None:
    """Keep the SASL password of ``owner`` (an aiokafka consumer, producer, admin or client,
    made with :func:`kafka_client_kwargs` of ``config``, not yet started) equal to its
    reference's current value, and count the logins the broker refuses. No-op without a SASL
    password."""
    live = _live_for(config)
    if live is not None:
        live.attach(owner)


def refresh(config: KafkaClientConfig | None) -> None:
    """Read ``config``'s SASL password reference again if :data:`REFRESH_S` passed since it
    was (a cheap call: once per fetch or send is fine)."""
    live = _live_for(config)
    if live is not None:
        live.refresh()


def login_stats(config: KafkaClientConfig | None) -> dict[str, int]:
    """``sasl_logins_refused`` (logins the broker refused), ``sasl_logins_refused_recent``
    (those of the last :data:`RECENT_S` seconds) and ``sasl_password_changes`` (rotations
    picked up) of ``config``'s SASL password in this process; {} without one."""
    live = _live_for(config)
    if live is None:
        return {}
    return {
        "sasl_logins_refused": live.refused,
        "sasl_logins_refused_recent": live.recent(),
        "sasl_password_changes": live.changes,
    }
