"""Figures are written when they change, or at the heartbeat (an idle pipeline writes little)."""

from __future__ import annotations

from eventbus.serving._figures import HEARTBEAT_S, ChangeGate


def test_unchanged_figures_wait_for_the_heartbeat_and_changed_ones_go_at_once() -> None:
    gate = ChangeGate()
    assert gate.due("p", {"consumed": 1}, now=0.0)
    assert not gate.due("p", {"consumed": 1}, now=1.0)
    assert gate.due("p", {"consumed": 2}, now=1.5)
    assert not gate.due("p", {"consumed": 2}, now=1.5 + HEARTBEAT_S - 0.1)
    assert gate.due("p", {"consumed": 2}, now=1.5 + HEARTBEAT_S)
    assert gate.due("q", {"consumed": 2}, now=2.0), "keys are independent"
    gate.forget("q")
    assert gate.due("q", {"consumed": 2}, now=2.1)
