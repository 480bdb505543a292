"""A bounded schemathesis run over the gateway's OpenAPI: no input makes it answer 5xx."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from eventbus.gateway._http import build_http_app
from eventbus.gateway._ingress import Ingress
from eventbus.gateway._routes import RouteTable
from tests.unit.gateway.conftest import ENV, MemoryBackend, default_docs


def _schema():
    docs = [d for d in default_docs() if d["metadata"]["name"] != "broken"]  # its 503 is on purpose
    app = build_http_app(Ingress(MemoryBackend(docs), RouteTable.from_documents(docs, ENV)))
    return schemathesis.openapi.from_asgi("/openapi.json", app)


SCHEMA = _schema()
OPERATIONS = [result.ok() for result in SCHEMA.get_all_operations()]


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: op.label)
def test_no_input_gives_a_server_error(operation) -> None:
    @given(
        case=operation.as_strategy(),
        name=st.sampled_from(["open", "orders", "payments", "kafka-only"]),
    )
    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def run(case, name: str) -> None:
        if case.path_parameters and "name" in case.path_parameters:
            case.path_parameters["name"] = name  # deployed pipelines, not only random names
        case.call_and_validate(checks=[not_a_server_error])

    run()
