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

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from eventbus.errors import ConfigError
from eventbus.eventing._kafka_client_kwargs import kafka_client_kwargs, kafka_client_problems
from eventbus.eventing._kafka_connect_error import kafka_connect_error
from eventbus.eventing._secret_ref import SecretRef

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
