"""Kafka client settings (TLS, SASL) and the one place that turns them into aiokafka kwargs.

Every Kafka client EventBus makes (sources, sinks, dead-letter sinks, the gateway's producers,
``publish``, ``tail``, ``replay``, ``redrive``, topic creation, the benchmarks) takes its
connection settings from :func:`kafka_client_kwargs`. The settings are set once for the stack
(``eventbus up --kafka-config FILE``, or ``$EVENTBUS_KAFKA_CONFIG``) and may be replaced per
source or sink in pipeline YAML (``kafka: {topic: t, client: {...}}``).

Secrets (a SASL password, a key's passphrase) are never values in these models: only a
reference, ``{env: NAME}`` or ``{file: PATH}``, resolved where the client is made. So the
pipeline record in Redis, logs and error messages carry the reference, never the secret.

Example::

    security_protocol: SASL_SSL
    ca_file: /etc/kafka/ca.pem
    sasl: {mechanism: SCRAM-SHA-512, username: eventbus, password: {env: KAFKA_PASSWORD}}
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import ssl
from pathlib import Path
from typing import Annotated, Any, Literal

from aiokafka.abc import AbstractTokenProvider
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from eventbus._internal.secret_store import NAME_PATTERN as SECRET_NAME
from eventbus.errors import ConfigError

__all__ = [
    "KafkaClientConfig",
    "KafkaSaslConfig",
    "SecretRef",
    "kafka_client_kwargs",
    "kafka_client_problems",
    "kafka_connect_error",
    "load_kafka_client_config",
]

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]


class SecretRef(BaseModel):
    """A secret by reference, never the value itself: ``{secret: NAME}`` (stored on the stack
    with ``eventbus secret set NAME``, encrypted in Redis), ``{env: NAME}`` (an environment
    variable where it is used) or ``{file: PATH}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    secret: Annotated[str, StringConstraints(pattern=SECRET_NAME)] | None = Field(
        default=None,
        description="Name of a secret stored on the stack (`eventbus secret set NAME`).",
    )
    env: str | None = Field(
        default=None, min_length=1, description="Name of the environment variable holding it."
    )
    file: str | None = Field(
        default=None, min_length=1, description="Path of a file holding it (trailing newline cut)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if sum(x is not None for x in (self.secret, self.env, self.file)) != 1:
            msg = "a secret reference takes exactly one of secret: NAME, env: NAME or file: PATH"
            raise ValueError(msg)
        return self

    def describe(self) -> str:
        """Where the secret comes from (``env KAFKA_PASSWORD``), safe to log."""
        if self.secret is not None:
            return f"secret {self.secret}"
        return f"env {self.env}" if self.env is not None else f"file {self.file}"

    def problem(self, what: str) -> str | None:
        """Why the secret cannot be read here, naming the reference; None when it can (a
        ``{secret: NAME}`` is checked where the stack's secrets are: ``deploy``)."""
        if self.secret is not None:
            return None
        if self.env is not None:
            if os.environ.get(self.env) is None:
                return f"{what}: environment variable {self.env} is not set; export it"
            return None
        assert self.file is not None
        if not os.access(self.file, os.R_OK):
            return f"{what}: file {self.file} does not exist or is not readable; create it"
        return None

    def resolve(self, what: str) -> str:
        """The secret's value.

        Raises:
            ConfigError: the variable is unset, the file unreadable or the stack's secret
                missing (the message names the reference, never a value).
        """
        if self.secret is not None:
            from eventbus._internal.secret_store import lookup

            try:
                return lookup(self.secret).decode()
            except ConfigError as e:
                raise ConfigError(f"{what}: {e}") from None
        problem = self.problem(what)
        if problem is not None:
            raise ConfigError(problem)
        if self.env is not None:
            return os.environ[self.env]
        assert self.file is not None
        return Path(self.file).read_text().rstrip("\r\n")


class KafkaSaslConfig(BaseModel):
    """SASL authentication of a Kafka client."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mechanism: SaslMechanism = Field(
        description="PLAIN (Confluent Cloud API keys), SCRAM-SHA-256/512, or OAUTHBEARER "
        "(MSK IAM, OIDC) with a token_provider."
    )
    username: str | None = Field(
        default=None, min_length=1, description="The user (PLAIN, SCRAM); not a secret."
    )
    password: SecretRef | None = Field(
        default=None,
        description="The password (PLAIN, SCRAM), by reference: {env: NAME} or {file: PATH}.",
    )
    token_provider: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
        description="OAUTHBEARER: 'module:attr' of an aiokafka AbstractTokenProvider (class or "
        "instance) or of a function returning the token (sync or async).",
    )

    @model_validator(mode="after")
    def _mechanism_needs(self) -> KafkaSaslConfig:
        if self.mechanism == "OAUTHBEARER":
            if self.token_provider is None:
                msg = "sasl mechanism OAUTHBEARER needs token_provider: 'module:attr'"
                raise ValueError(msg)
        elif self.username is None or self.password is None:
            msg = (
                f"sasl mechanism {self.mechanism} needs username and password "
                "(password: {env: NAME} or {file: PATH})"
            )
            raise ValueError(msg)
        return self


class KafkaClientConfig(BaseModel):
    """How a Kafka client connects: security protocol, TLS files, SASL.

    The default is today's behaviour: plaintext, no authentication.

    Example:
        >>> cfg = KafkaClientConfig(security_protocol="SSL", ca_file="/etc/kafka/ca.pem")
        >>> sorted(kafka_client_kwargs(cfg))  # doctest: +SKIP
        ['security_protocol', 'ssl_context']
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    security_protocol: SecurityProtocol = Field(
        default="PLAINTEXT",
        description="PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL (SASL over TLS).",
    )
    ca_file: str | None = Field(
        default=None,
        min_length=1,
        description="PEM file of the CAs that sign the brokers' certificates; None trusts the "
        "system's CAs.",
    )
    cert_file: str | None = Field(
        default=None, min_length=1, description="PEM client certificate (mutual TLS, e.g. Aiven)."
    )
    key_file: str | None = Field(
        default=None, min_length=1, description="PEM private key of cert_file."
    )
    key_password: SecretRef | None = Field(
        default=None, description="Passphrase of key_file, by reference, when it is encrypted."
    )
    check_hostname: bool = Field(
        default=True,
        description="Check that the broker's certificate names the host connected to.",
    )
    sasl: KafkaSaslConfig | None = Field(
        default=None, description="SASL authentication; required by SASL_PLAINTEXT/SASL_SSL."
    )

    @model_validator(mode="after")
    def _consistent(self) -> KafkaClientConfig:
        protocol = self.security_protocol
        if protocol.startswith("SASL") and self.sasl is None:
            msg = f"security_protocol {protocol} needs sasl: {{mechanism: ..., ...}}"
            raise ValueError(msg)
        if not protocol.startswith("SASL") and self.sasl is not None:
            msg = (
                f"sasl is set but security_protocol is {protocol}; use SASL_SSL (or "
                "SASL_PLAINTEXT) to authenticate with SASL"
            )
            raise ValueError(msg)
        tls_fields = [
            name
            for name in ("ca_file", "cert_file", "key_file", "key_password")
            if getattr(self, name) is not None
        ]
        if not protocol.endswith("SSL") and tls_fields:
            msg = (
                f"{', '.join(tls_fields)} set but security_protocol is {protocol}; use SSL "
                "or SASL_SSL for TLS"
            )
            raise ValueError(msg)
        if (self.cert_file is None) != (self.key_file is None):
            msg = "cert_file and key_file go together (a client certificate and its key)"
            raise ValueError(msg)
        return self

    @property
    def uses_tls(self) -> bool:
        """Whether the connection is TLS."""
        return self.security_protocol.endswith("SSL")


def kafka_client_problems(config: KafkaClientConfig | None, where: str) -> list[str]:
    """What would stop a client with ``config`` from being made here, one line each.

    Missing secret references, unreadable files, a token provider that does not import. The
    lines name the reference (``environment variable KAFKA_PASSWORD``), never a secret.
    """
    if config is None:
        return []
    problems: list[str] = []
    for name in ("ca_file", "cert_file", "key_file"):
        path = getattr(config, name)
        if path is not None and not os.access(path, os.R_OK):
            problems.append(f"{where}.{name}: file {path} does not exist or is not readable")
    if config.key_password is not None:
        p = config.key_password.problem(f"{where}.key_password")
        if p:
            problems.append(p)
    sasl = config.sasl
    if sasl is not None:
        if sasl.password is not None:
            p = sasl.password.problem(f"{where}.sasl.password")
            if p:
                problems.append(p)
        if sasl.token_provider is not None:
            try:
                _import_attr(sasl.token_provider)
            except ConfigError as e:
                problems.append(f"{where}.sasl.token_provider: {e}")
    return problems


def kafka_client_kwargs(config: KafkaClientConfig | None) -> dict[str, Any]:
    """The aiokafka keyword arguments (producer, consumer, admin) for ``config``.

    Called once per client made, never per event. None (or the default config) gives ``{}``:
    plaintext, as before.

    Raises:
        ConfigError: a secret reference cannot be resolved, a TLS file cannot be loaded, or
            the token provider cannot be imported (the message names which).
    """
    if config is None or config.security_protocol == "PLAINTEXT":
        return {}
    kwargs: dict[str, Any] = {"security_protocol": config.security_protocol}
    if config.uses_tls:
        kwargs["ssl_context"] = _ssl_context(config)
    sasl = config.sasl
    if sasl is not None:
        kwargs["sasl_mechanism"] = sasl.mechanism
        if sasl.mechanism == "OAUTHBEARER":
            assert sasl.token_provider is not None
            kwargs["sasl_oauth_token_provider"] = _token_provider(sasl.token_provider)
        else:
            assert sasl.password is not None
            kwargs["sasl_plain_username"] = sasl.username
            kwargs["sasl_plain_password"] = sasl.password.resolve("kafka sasl.password")
    return kwargs


def _ssl_context(config: KafkaClientConfig) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH, cafile=config.ca_file)
    except (OSError, ssl.SSLError) as e:
        msg = f"kafka ca_file {config.ca_file}: cannot load it as PEM CA certificates ({e}); fix the path or the file"
        raise ConfigError(msg) from e
    context.check_hostname = config.check_hostname
    if config.cert_file is not None:
        password = (
            config.key_password.resolve("kafka key_password")
            if config.key_password is not None
            else None
        )
        try:
            context.load_cert_chain(config.cert_file, config.key_file, password=password)
        except (OSError, ssl.SSLError) as e:
            msg = (
                f"kafka cert_file {config.cert_file} / key_file {config.key_file}: cannot load "
                f"the client certificate ({type(e).__name__}: {e.strerror or e}); check the "
                "paths, that the key matches the certificate, and key_password"
            )
            raise ConfigError(msg) from e
    return context


def _import_attr(ref: str) -> Any:
    module_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        msg = f"cannot import {ref!r} ({e}); check the module is on PYTHONPATH on every node"
        raise ConfigError(msg) from e
    return obj


def _token_provider(ref: str) -> Any:
    obj = _import_attr(ref)
    if inspect.isclass(obj) and issubclass(obj, AbstractTokenProvider):
        return obj()
    if isinstance(obj, AbstractTokenProvider):
        return obj
    if callable(obj):
        return _CallableTokenProvider(obj)
    msg = (
        f"kafka sasl.token_provider {ref!r} is a {type(obj).__name__}; name an aiokafka "
        "AbstractTokenProvider (class or instance) or a function returning the token"
    )
    raise ConfigError(msg)


class _CallableTokenProvider(AbstractTokenProvider):  # type: ignore[misc]  # untyped base
    """Adapts a plain function (sync or async) returning a token to aiokafka's interface."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    async def token(self) -> str:
        value = self._fn()
        if inspect.isawaitable(value):
            value = await value
        return str(value)


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


def load_kafka_client_config(path: str | Path) -> KafkaClientConfig:
    """Read a :class:`KafkaClientConfig` from a YAML or JSON file (``--kafka-config FILE``).

    Raises:
        ConfigError: the file is unreadable or not a valid config (each problem named).
    """
    import yaml
    from pydantic import ValidationError

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        msg = f"kafka config {path}: cannot read it ({e}); pass a YAML or JSON file"
        raise ConfigError(msg) from e
    try:
        return KafkaClientConfig.model_validate(data or {})
    except ValidationError as e:
        lines = [
            f"{path}: {'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}"
            for err in e.errors(include_input=False)
        ]
        msg = "kafka config is invalid:\n" + "\n".join(lines)
        raise ConfigError(msg) from e
