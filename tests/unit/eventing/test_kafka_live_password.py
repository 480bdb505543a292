"""A Kafka SASL password that follows its reference (``_kafka_live_password``) on real aiokafka
clients (made, not started: the password is what their next login would send). The broker's
side (a refused login, a rotation under a running source) is in
``tests/integration/test_kafka_secret_rotation.py``."""

from __future__ import annotations

import inspect
import logging
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.conn import CloseReason

from eventbus.eventing import KafkaClientConfig
from eventbus.eventing._aiokafka_adapter import kafka_client_of
from eventbus.eventing._kafka_client import kafka_client_kwargs
from eventbus.eventing._kafka_live_password import follow_password, login_stats, refresh


def _config(path: Path) -> KafkaClientConfig:
    return KafkaClientConfig.model_validate(
        {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl": {
                "mechanism": "SCRAM-SHA-512",
                # one user per test: the live passwords are per process, per reference
                "username": f"u-{uuid.uuid4().hex[:6]}",
                "password": {"file": str(path)},
            },
        }
    )


def _password(owner: object) -> str:
    return kafka_client_of(owner)._sasl_plain_password  # type: ignore[no-any-return]


def test_aiokafka_reads_the_attributes_at_each_login() -> None:
    # what the adapter relies on (aiokafka==0.14.0): a connection is made with the client's
    # current password and close callback, and a refused login closes it with AUTH_FAILURE
    source = inspect.getsource(AIOKafkaClient)
    assert "sasl_plain_password=self._sasl_plain_password" in source
    assert "on_close=self._on_connection_closed" in source
    from aiokafka import conn

    assert "self.close(reason=CloseReason.AUTH_FAILURE, exc=exc)" in inspect.getsource(conn)


async def test_rotation_reaches_every_attached_client_and_refusals_are_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "pw"
    path.write_text("Pw1-q\n")
    config = _config(path)
    kwargs = kafka_client_kwargs(config)
    consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", **kwargs)
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", **kwargs)
    try:
        follow_password(consumer, config)
        follow_password(producer, config)
        assert _password(consumer) == _password(producer) == "Pw1-q"
        assert login_stats(config) == {
            "sasl_logins_refused": 0,
            "sasl_logins_refused_recent": 0,
            "sasl_password_changes": 0,
        }

        # rotated in the file: the next refresh after REFRESH_S hands it to both clients
        path.write_text("Pw2-q\n")
        import eventbus.eventing._kafka_live_password as live

        monkeypatch.setattr(live, "REFRESH_S", 0.0)
        refresh(config)
        assert _password(consumer) == _password(producer) == "Pw2-q"
        assert login_stats(config)["sasl_password_changes"] == 1

        # the broker refuses a login: counted, logged once (naming user and reference, no
        # value), and the reference read again at once whatever REFRESH_S says
        monkeypatch.setattr(live, "REFRESH_S", 3600.0)
        path.write_text("Pw3-q\n")
        client = kafka_client_of(consumer)
        with caplog.at_level(logging.ERROR, logger="eventbus.eventing.kafka"):
            for _ in range(3):
                client._on_connection_closed(object(), CloseReason.AUTH_FAILURE)
            client._on_connection_closed(object(), CloseReason.CONNECTION_BROKEN)  # not a login
        assert login_stats(config) == {
            "sasl_logins_refused": 3,
            "sasl_logins_refused_recent": 3,  # the pipeline's status is DEGRADED meanwhile
            "sasl_password_changes": 2,
        }
        monkeypatch.setattr(live, "RECENT_S", 0.0)  # a minute later: none recent
        assert login_stats(config)["sasl_logins_refused_recent"] == 0
        assert login_stats(config)["sasl_logins_refused"] == 3
        assert _password(producer) == "Pw3-q"
        lines = [r.getMessage() for r in caplog.records if r.name == "eventbus.eventing.kafka"]
        assert len(lines) == 1, lines  # at most one line per 30 s, however many refusals
        user = config.sasl.username if config.sasl else None
        assert (
            f"refused the SASL SCRAM-SHA-512 login of user {user!r} (1 refused so far)" in lines[0]
        )
        assert f"the password from file {path} is not the broker's" in lines[0]
        assert not any(v in lines[0] for v in ("Pw1-q", "Pw2-q", "Pw3-q"))

        # the file gone: logins keep the last value (a warning), nothing raised
        path.unlink()
        monkeypatch.setattr(live, "REFRESH_S", 0.0)
        with caplog.at_level(logging.WARNING, logger="eventbus.eventing.kafka"):
            refresh(config)
        assert _password(consumer) == "Pw3-q"
        assert any("keep the password read before" in r.getMessage() for r in caplog.records)
    finally:
        await consumer.stop()
        await producer.stop()


def test_no_sasl_password_is_a_no_op(tmp_path: Path) -> None:
    assert login_stats(None) == {}
    follow_password(object(), None)
    refresh(None)
    plain = KafkaClientConfig()
    assert login_stats(plain) == {}
