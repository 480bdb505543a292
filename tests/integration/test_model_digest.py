"""A model artifact whose stored bytes changed after the push is refused, never served."""

from __future__ import annotations

import hashlib
import io
import re
import uuid

import pytest
import redis
import torch

from eventbus._internal import keys
from eventbus.errors import ModelError, ModelValidationError
from eventbus.models import ModelRegistry, load_model
from eventbus.models._serve import validate_version
from tests.unit.models.factories import mlp

pytestmark = [pytest.mark.integration, pytest.mark.redis]

FACTORY = "tests.unit.models.factories:mlp"


def test_a_tampered_artifact_is_refused_naming_model_version_and_digests(redis_url: str) -> None:
    registry = ModelRegistry(redis_url)
    name = f"digest-{uuid.uuid4().hex[:8]}"
    buf = io.BytesIO()
    torch.save(mlp().state_dict(), buf)
    pushed = buf.getvalue()
    version = registry.add_version(name, pushed, format="state_dict", factory=FACTORY)
    assert registry.record(name, version)["sha256"] == hashlib.sha256(pushed).hexdigest()
    assert load_model(registry.blob(name, version), factory=FACTORY) is not None  # untouched

    tampered = pushed[:-1] + bytes([pushed[-1] ^ 0xFF])
    redis.Redis.from_url(redis_url).set(keys.model_blob(name, version), tampered)
    expect = (
        f"model {name!r} version {version}: the stored artifact's sha256 is "
        f"{hashlib.sha256(tampered).hexdigest()}, but {hashlib.sha256(pushed).hexdigest()} was "
        "recorded when it was pushed"
    )
    with pytest.raises(ModelError, match=re.escape(expect)):
        registry.blob(name, version)
    # Validation (the way a version reaches serving) refuses it and marks it rejected.
    with pytest.raises(ModelValidationError):
        validate_version(registry, name, version)
    record = registry.record(name, version)
    assert record["status"] == "rejected"
    assert expect in record["error"]
    assert registry.state(name)["serving"] is None
