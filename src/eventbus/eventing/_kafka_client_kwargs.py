"""Kafka client settings into aiokafka keyword arguments (TLS context, SASL, token provider),
and the check of what would stop a client from being made here."""

from __future__ import annotations

import importlib
import inspect
import os
import ssl
from typing import TYPE_CHECKING, Any

from aiokafka.abc import AbstractTokenProvider

from eventbus.errors import ConfigError

if TYPE_CHECKING:
    from eventbus.eventing._kafka_client import KafkaClientConfig

__all__ = ["kafka_client_kwargs", "kafka_client_problems"]


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
