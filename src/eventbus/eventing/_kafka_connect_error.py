"""A clear error for a Kafka client that failed to start: on aiokafka's vague failures it probes
the first broker itself (TCP, TLS, the SASL login) to name the cause and the fix."""

from __future__ import annotations

import contextlib
import ssl
from typing import TYPE_CHECKING

from eventbus.errors import ConfigError
from eventbus.eventing._kafka_client_kwargs import _ssl_context, kafka_client_kwargs

if TYPE_CHECKING:
    from eventbus.eventing._kafka_client import KafkaClientConfig, KafkaSaslConfig

__all__ = ["kafka_connect_error"]


async def kafka_connect_error(
    what: str, servers: str, config: KafkaClientConfig | None, exc: BaseException
) -> Exception:
    """A clear error for a client that failed to start, naming the cause and the fix.

    aiokafka reports a failed TLS handshake or a closed SASL exchange as "Unable to bootstrap"
    (the cause only in a log line) and a refused SCRAM login as a ``KeyError``; on that (rare)
    path this probes the first broker itself (TCP, then TLS with the same context) to tell
    the causes apart. Never called per event.

    Args:
        what: the client's owner (``kafka source of pipeline 'orders'``).
        servers: the bootstrap servers.
        config: the connection settings used.
        exc: what the client raised.

    Returns:
        ``exc`` itself when it is a :class:`ConfigError` (a missing secret, say), else a
        :class:`StackError`; never carries a secret.
    """
    from eventbus.errors import StackError

    if isinstance(exc, ConfigError):
        return exc
    from aiokafka.errors import InvalidSessionTimeoutError, KafkaError

    protocol = config.security_protocol if config is not None else "PLAINTEXT"
    sasl = config.sasl if config is not None else None
    reason = f"{type(exc).__name__}: {exc}"
    fix = "check that it runs and the address is right (`eventbus up` starts a local one)"
    refused_login = isinstance(exc, KeyError) or "authentication" in type(exc).__name__.lower()
    if isinstance(exc, InvalidSessionTimeoutError):
        reason = "the broker refused the consumer group's session timeout"
        fix = (
            "set the source's session_timeout_ms within the broker's "
            "group.min.session.timeout.ms and group.max.session.timeout.ms (Apache Kafka: "
            "6000 and 1800000 unless its operator changed them)"
        )
    elif not isinstance(exc, KafkaError | KeyError) and not refused_login:
        reason = f"{type(exc).__name__}: {exc}"
    elif refused_login and sasl is not None:
        reason = f"the broker refused the SASL {sasl.mechanism} login of user {sasl.username!r}"
        fix = _sasl_fix(sasl)
    else:
        server = servers.split(",")[0].strip()
        probe = await _probe(server, config)
        if probe is not None:
            reason, fix = probe
        elif sasl is not None:
            assert config is not None
            refused = await _probe_login(server, config)
            if refused is not None:
                reason, fix = refused, _sasl_fix(sasl)
            else:
                reason = (
                    f"the broker accepted the {'TLS ' if protocol == 'SASL_SSL' else ''}"
                    f"connection but closed it during the SASL {sasl.mechanism} exchange"
                )
                fix = _sasl_fix(sasl) + ", and that the broker accepts that mechanism"
    msg = f"{what} cannot connect to the Kafka broker at {servers} ({protocol}): {reason}; {fix}"
    return StackError(msg)


def _sasl_fix(sasl: KafkaSaslConfig) -> str:
    if sasl.mechanism == "OAUTHBEARER":
        return f"check the token that {sasl.token_provider} returns"
    assert sasl.password is not None
    return (
        f"check sasl.username, the password in {sasl.password.describe()} and the mechanism "
        f"({sasl.mechanism})"
    )


async def _probe(server: str, config: KafkaClientConfig | None) -> tuple[str, str] | None:
    """Why a TCP/TLS connection to ``server`` fails, with the fix; None when it succeeds."""
    import asyncio

    host, _, port = server.rpartition(":")
    context = _ssl_context(config) if config is not None and config.uses_tls else None
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port), ssl=context), 10
        )
    except ssl.SSLCertVerificationError as e:
        ca = config.ca_file if config is not None else None
        return (
            f"TLS: the broker's certificate is not trusted ({e.verify_message})",
            f"set ca_file to the CA that signed it (now: {ca or 'the system CAs'})"
            + (
                "; or check_hostname: false if its name cannot match"
                if "hostname" in str(e).lower()
                else ""
            ),
        )
    except ssl.SSLError as e:
        return (
            f"TLS handshake failed ({e.reason or e})",
            "check that the listener speaks TLS (security_protocol SSL/SASL_SSL) and, for "
            "mutual TLS, cert_file and key_file",
        )
    except (OSError, TimeoutError, ValueError) as e:
        return (
            f"cannot open a connection ({type(e).__name__}: {e})",
            "check that the broker runs and the address is right",
        )
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await writer.wait_closed()
    return None


async def _probe_login(server: str, config: KafkaClientConfig) -> str | None:
    """The broker's verdict on the SASL login, when it refuses it (aiokafka's bootstrap only
    logs it and answers "Unable to bootstrap"); None when the login works or fails otherwise.
    """
    import asyncio

    from aiokafka.conn import create_conn
    from aiokafka.errors import SaslAuthenticationFailed, UnsupportedSaslMechanismError

    sasl = config.sasl
    assert sasl is not None
    host, _, port = server.rpartition(":")
    try:
        conn = await asyncio.wait_for(
            create_conn(host.strip("[]"), int(port), **kafka_client_kwargs(config)), 10
        )
    except SaslAuthenticationFailed as e:
        # Kafka's message names the mechanism and never the password ("invalid credentials")
        detail = str(e).split(": ", 1)[-1]
        return f"the broker refused the SASL {sasl.mechanism} login of user {sasl.username!r} ({detail})"
    except UnsupportedSaslMechanismError as e:
        return f"the broker does not accept SASL {sasl.mechanism} ({e})"
    except Exception:  # noqa: BLE001 - no verdict: the caller says what it knows
        return None
    conn.close()
    return None
