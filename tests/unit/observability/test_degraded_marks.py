"""A pipeline's DEGRADED marks in its status view: a deleted topic (``mark_degraded``) and
Kafka refusing its clients' SASL logins (``mark_refused_logins``), each with its reason."""

from __future__ import annotations

import json

from eventbus.observability._view import mark_degraded, mark_refused_logins


def test_refused_logins_turn_a_running_pipeline_degraded_naming_the_fix() -> None:
    view = {"state": "RUNNING"}
    sources = [
        {"consumed": 5, "sasl_logins_refused": 7, "sasl_logins_refused_recent": 2},
        {"sasl_logins_refused_recent": 1},
        {"error": "ActorDiedError: gone"},  # a source that could not be asked
    ]
    mark_refused_logins(view, sources, "orders")
    assert view["state"] == "DEGRADED"
    reason = view["degraded_reason"]
    assert reason.startswith("the Kafka broker refused 3 SASL login(s)"), reason
    assert "eventbus secret set NAME" in reason and "no restart needed" in reason
    assert "`eventbus logs orders`" in reason


def test_old_refusals_or_none_leave_the_view_as_it_is() -> None:
    for sources in ([], [{"sasl_logins_refused": 9, "sasl_logins_refused_recent": 0}], [{}]):
        view = {"state": "RUNNING"}
        mark_refused_logins(view, sources, "p")
        assert view == {"state": "RUNNING"}


def test_both_reasons_are_kept_and_a_pipeline_at_zero_stays_at_zero() -> None:
    view = {"state": "RUNNING"}
    mark_degraded(view, json.dumps({"reason": "topic 'in' was deleted", "since": 1.0}))
    mark_refused_logins(view, [{"sasl_logins_refused_recent": 1}], "p")
    assert view["state"] == "DEGRADED"
    assert view["degraded_reason"].startswith("topic 'in' was deleted; the Kafka broker")
    at_zero = {"state": "SCALED_TO_ZERO"}
    mark_refused_logins(at_zero, [{"sasl_logins_refused_recent": 1}], "p")
    assert at_zero["state"] == "SCALED_TO_ZERO" and "degraded_reason" in at_zero
