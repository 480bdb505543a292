"""TLS, SASL/SCRAM-SHA-512 and ACLs served by a local Apache Kafka (:mod:`.kafka_broker`).

:class:`KafkaSecurity` secures a cluster's client listener, which is also its inter-broker
listener (the brokers talk to each other as the admin user):

* ``SSL``: TLS with a PEM certificate chain and key (``ssl.keystore.type=PEM``); the CA file
  is the brokers' truststore (they check each other's certificate like any client);
* ``SASL_SSL`` / ``SASL_PLAINTEXT``: SCRAM-SHA-512 logins. The admin (super) user's
  credential is written into the metadata log when the storage is formatted
  (``StorageTool format --add-scram``: how KRaft bootstraps its first user, here with a salted
  password so the password is never on a command line); other users are created by the admin
  at runtime through the Admin API (AlterUserScramCredentials), as on any Kafka;
* ``acls=True``: the ``StandardAuthorizer`` (ACLs in the metadata log), the admin a super
  user, everyone else denied what no ACL grants.

The controller listener stays on loopback: PLAINTEXT without SASL, else SASL/PLAIN with the
admin alone in its JAAS user list (SCRAM cannot serve controllers: its credentials live in
the metadata the controllers serve), so no one else reaches the quorum with super rights.

Files holding secrets (``server.properties``, the keystore, the admin's password file) are
written mode 0600 under the cluster's directory.

Example:
    >>> sec = KafkaSecurity("SASL_SSL", cert_file=c, key_file=k, ca_file=ca,  # doctest: +SKIP
    ...                     admin_password="s3cret", acls=True)
    >>> cluster = start_kafka(home=tmp, security=sec)                        # doctest: +SKIP
    >>> cluster.admin_client                   # a KafkaClientConfig      # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import secrets
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from eventbus.errors import ConfigError

if TYPE_CHECKING:
    from eventbus.eventing import KafkaClientConfig

__all__ = ["SCRAM_ITERATIONS", "KafkaSecurity", "secured_ready"]

#: PBKDF2 iterations of the admin's SCRAM-SHA-512 credential (Kafka's minimum is 4096).
SCRAM_ITERATIONS = 8192
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
_SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
_PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule"


@dataclass(frozen=True)
class KafkaSecurity:
    """How a local cluster's client (and inter-broker) listener is secured.

    Attributes:
        protocol: ``SSL``, ``SASL_SSL`` or ``SASL_PLAINTEXT``.
        cert_file: PEM certificate chain the brokers present (TLS); it must name ``127.0.0.1``.
        key_file: its private key, PEM PKCS#8 unencrypted (``BEGIN PRIVATE KEY``).
        ca_file: PEM CA that signed ``cert_file``: the brokers' truststore, and the ``ca_file``
            of :attr:`admin_client`.
        admin_user: the super user (SASL), bootstrapped at storage format time.
        admin_password: its SCRAM-SHA-512 password (SASL); never in ``repr``.
        acls: serve ACLs (``StandardAuthorizer``); needs SASL, so principals are users.
    """

    protocol: Literal["SSL", "SASL_SSL", "SASL_PLAINTEXT"]
    cert_file: Path | None = None
    key_file: Path | None = None
    ca_file: Path | None = None
    admin_user: str = "admin"
    admin_password: str = field(default="", repr=False)
    acls: bool = False

    def __post_init__(self) -> None:
        if self.tls and None in (self.cert_file, self.key_file, self.ca_file):
            msg = f"Kafka listener security {self.protocol} needs cert_file, key_file and ca_file (PEM)"
            raise ConfigError(msg)
        if self.sasl and not self.admin_password:
            msg = f"Kafka listener security {self.protocol} needs the admin user's admin_password"
            raise ConfigError(msg)
        if self.acls and not self.sasl:
            msg = (
                "acls=True needs a SASL protocol (SASL_SSL or SASL_PLAINTEXT): without logins "
                "every client is User:ANONYMOUS"
            )
            raise ConfigError(msg)
        if any(c in self.admin_user for c in ',=[]"'):
            msg = f"admin_user {self.admin_user!r}: use letters, digits, '-', '_' or '.'"
            raise ConfigError(msg)

    @property
    def tls(self) -> bool:
        """Whether the listener speaks TLS."""
        return self.protocol.endswith("SSL")

    @property
    def sasl(self) -> bool:
        """Whether the listener takes SASL logins."""
        return self.protocol.startswith("SASL")

    @property
    def admin_principal(self) -> str:
        """``User:<admin_user>``."""
        return f"User:{self.admin_user}"

    def properties(self, port: int, controller_port: int, home: Path) -> dict[str, str]:
        """The ``server.properties`` of one node's listeners (over the plaintext defaults).

        Args:
            port: the node's client listener port.
            controller_port: its controller listener port.
            home: the cluster's directory (the keystore is written there).
        """
        name, host = self.protocol, "127.0.0.1"
        controller = "SASL_PLAINTEXT" if self.sasl else "PLAINTEXT"
        props = {
            "listeners": f"{name}://{host}:{port},CONTROLLER://{host}:{controller_port}",
            "advertised.listeners": f"{name}://{host}:{port}",
            "inter.broker.listener.name": name,
            "listener.security.protocol.map": f"{name}:{name},CONTROLLER:{controller}",
        }
        if self.tls:
            props |= {
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(self._keystore(home)),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(self.ca_file),
                "ssl.client.auth": "none",
                "ssl.endpoint.identification.algorithm": "https",
            }
        if self.sasl:
            user, pw = _jaas_quote(self.admin_user), _jaas_quote(self.admin_password)
            low = name.lower()
            props |= {
                f"listener.name.{low}.sasl.enabled.mechanisms": "SCRAM-SHA-512",
                f"listener.name.{low}.scram-sha-512.sasl.jaas.config": (
                    f"{_SCRAM_LOGIN} required username={user} password={pw};"
                ),
                "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
                "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
                "listener.name.controller.plain.sasl.jaas.config": (
                    f"{_PLAIN_LOGIN} required username={user} password={pw} "
                    f"user_{self.admin_user}={pw};"
                ),
                "sasl.mechanism.controller.protocol": "PLAIN",
            }
        if self.acls:
            props |= {
                "authorizer.class.name": STANDARD_AUTHORIZER,
                "super.users": self.admin_principal,
                "allow.everyone.if.no.acl.found": "false",
            }
        return props

    def format_args(self) -> list[str]:
        """``StorageTool format`` arguments bootstrapping the admin's SCRAM-SHA-512 credential:
        a random salt and the salted password (PBKDF2-HMAC-SHA512), never the password."""
        if not self.sasl:
            return []
        salt = secrets.token_bytes(24)
        salted = hashlib.pbkdf2_hmac("sha512", self.admin_password.encode(), salt, SCRAM_ITERATIONS)
        b64 = base64.b64encode
        return [
            "--add-scram",
            f"SCRAM-SHA-512=[name={self.admin_user},salt={b64(salt).decode()},"
            f"saltedpassword={b64(salted).decode()},iterations={SCRAM_ITERATIONS}]",
        ]

    def admin_client(self, home: Path) -> KafkaClientConfig:
        """The admin's client settings: TLS trusting ``ca_file``; SASL as the admin, the
        password by reference to a file (mode 0600) under ``home``."""
        from eventbus.eventing import KafkaClientConfig

        doc: dict[str, object] = {"security_protocol": self.protocol}
        if self.tls:
            doc["ca_file"] = str(self.ca_file)
        if self.sasl:
            pw_file = home / "admin.password"
            write_private(pw_file, self.admin_password)
            doc["sasl"] = {
                "mechanism": "SCRAM-SHA-512",
                "username": self.admin_user,
                "password": {"file": str(pw_file)},
            }
        return KafkaClientConfig.model_validate(doc)

    def _keystore(self, home: Path) -> Path:
        """Key and chain in one PEM file, as ``ssl.keystore.type=PEM`` reads a location."""
        assert self.cert_file is not None and self.key_file is not None
        key = Path(self.key_file).read_text()
        if "-----BEGIN PRIVATE KEY-----" not in key:
            msg = (
                f"Kafka reads PEM keys in PKCS#8 form only and {self.key_file} is not one "
                "(no 'BEGIN PRIVATE KEY'); convert it: openssl pkcs8 -topk8 -nocrypt -in "
                f"{self.key_file} -out key-pkcs8.pem"
            )
            raise ConfigError(msg)
        path = home / "tls" / "keystore.pem"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, key.rstrip() + "\n" + Path(self.cert_file).read_text())
        return path


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600), from the first byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)  # a file that existed keeps its mode through O_CREAT


def secured_ready(address: str, client: KafkaClientConfig, timeout_s: float = 5.0) -> bool:
    """Whether the broker at ``address`` answers a metadata request over its secured listener
    as ``client`` (the admin): TLS handshake, SASL login and all. False while it starts (the
    login fails until the broker has loaded the admin's credential from the metadata log).
    """
    host, _, port = address.rpartition(":")
    try:  # not listening yet: no client (and none of its connection errors in the log)
        socket.create_connection((host, int(port)), timeout=1.0).close()
    except OSError:
        return False
    result = [False]

    def probe() -> None:  # its own thread and loop: callers may be inside a running loop
        result[0] = asyncio.run(_probe(address, client, timeout_s))

    thread = threading.Thread(target=probe, name="eventbus-kafka-probe", daemon=True)
    thread.start()
    thread.join(timeout_s + 5)
    return result[0]


async def _probe(address: str, client: KafkaClientConfig, timeout_s: float) -> bool:
    from aiokafka.admin import AIOKafkaAdminClient

    from eventbus.eventing._kafka_client import kafka_client_kwargs

    admin = AIOKafkaAdminClient(
        bootstrap_servers=address,
        request_timeout_ms=int(timeout_s * 1000),
        **kafka_client_kwargs(client),
    )
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        await asyncio.wait_for(admin.describe_cluster(), timeout_s)
    except Exception:  # noqa: BLE001 - not ready yet, whatever the reason; the caller retries
        return False
    finally:
        await admin.close()
    return True
