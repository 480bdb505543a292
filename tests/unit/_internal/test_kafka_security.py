"""The server.properties and format arguments of a secured local Kafka (no broker started)."""

from __future__ import annotations

import base64
import hashlib
import re
import stat
from pathlib import Path

import pytest

from eventbus._internal.kafka_security import SCRAM_ITERATIONS, KafkaSecurity
from eventbus.errors import ConfigError

PKCS8 = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n"
CHAIN = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def _files(tmp_path: Path, key: str = PKCS8) -> dict[str, Path]:
    (tmp_path / "key.pem").write_text(key)
    (tmp_path / "chain.pem").write_text(CHAIN)
    (tmp_path / "ca.pem").write_text(CHAIN)
    return {
        "cert_file": tmp_path / "chain.pem",
        "key_file": tmp_path / "key.pem",
        "ca_file": tmp_path / "ca.pem",
    }


def test_sasl_ssl_with_acls(tmp_path: Path) -> None:
    sec = KafkaSecurity("SASL_SSL", **_files(tmp_path), admin_password='pw"x', acls=True)
    props = sec.properties(9093, 9094, tmp_path)
    assert props["listeners"] == "SASL_SSL://127.0.0.1:9093,CONTROLLER://127.0.0.1:9094"
    assert props["inter.broker.listener.name"] == "SASL_SSL"
    assert props["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT"
    assert props["listener.name.sasl_ssl.sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["sasl.mechanism.controller.protocol"] == "PLAIN"
    assert 'password="pw\\"x"' in props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]
    assert 'user_admin="pw\\"x";' in props["listener.name.controller.plain.sasl.jaas.config"]
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert props["super.users"] == "User:admin"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    keystore = Path(props["ssl.keystore.location"])
    assert keystore.read_text() == PKCS8 + CHAIN
    assert stat.S_IMODE(keystore.stat().st_mode) == 0o600
    assert "pw" not in repr(sec)


def test_format_args_carry_a_salted_password_never_the_password(tmp_path: Path) -> None:
    sec = KafkaSecurity("SASL_PLAINTEXT", admin_password="s3cret-pw")
    flag, value = sec.format_args()
    assert flag == "--add-scram" and "s3cret-pw" not in value
    m = re.fullmatch(
        r"SCRAM-SHA-512=\[name=admin,salt=(\S+),saltedpassword=(\S+),iterations=(\d+)\]", value
    )
    assert m is not None and int(m[3]) == SCRAM_ITERATIONS
    salt, salted = base64.b64decode(m[1]), base64.b64decode(m[2])
    assert salted == hashlib.pbkdf2_hmac("sha512", b"s3cret-pw", salt, SCRAM_ITERATIONS)


def test_admin_client_refers_to_a_private_password_file(tmp_path: Path) -> None:
    sec = KafkaSecurity("SASL_SSL", **_files(tmp_path), admin_password="pw")
    client = sec.admin_client(tmp_path)
    assert client.sasl is not None and client.sasl.password is not None
    pw_file = Path(client.sasl.password.file or "")
    assert pw_file.read_text() == "pw"
    assert stat.S_IMODE(pw_file.stat().st_mode) == 0o600
    assert client.ca_file == str(tmp_path / "ca.pem")


@pytest.mark.parametrize(
    ("kwargs", "expect"),
    [
        ({"protocol": "SSL"}, "needs cert_file, key_file and ca_file"),
        ({"protocol": "SASL_PLAINTEXT"}, "needs the admin user's admin_password"),
        ({"protocol": "SASL_PLAINTEXT", "admin_password": "p", "admin_user": "a,b"}, "admin_user"),
    ],
)
def test_incomplete_settings_are_named(kwargs: dict[str, str], expect: str) -> None:
    with pytest.raises(ConfigError, match=expect):
        KafkaSecurity(**kwargs)  # type: ignore[arg-type]


def test_acls_need_logins(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="acls=True needs a SASL protocol"):
        KafkaSecurity("SSL", **_files(tmp_path), acls=True)


def test_a_key_kafka_cannot_read_is_named_with_the_fix(tmp_path: Path) -> None:
    files = _files(
        tmp_path, key="-----BEGIN EC PRIVATE KEY-----\nx\n-----END EC PRIVATE KEY-----\n"
    )
    sec = KafkaSecurity("SSL", **files)
    with pytest.raises(ConfigError, match=r"PKCS#8 .*openssl pkcs8 -topk8 -nocrypt"):
        sec.properties(1, 2, tmp_path)
