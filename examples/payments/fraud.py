"""A batch function for the payments example: a rule-based fraud score per payment."""

from __future__ import annotations

import eventbus
from eventbus import CloudEvent


@eventbus.function(batch=True)
def score(events: list[CloudEvent]) -> list[CloudEvent]:
    """Add ``data.fraud_score`` in [0, 1]: large amounts and new accounts score higher."""
    out = []
    for e in events:
        data = dict(e.data)
        if "account_age_days" in data and not isinstance(data["account_age_days"], int):
            msg = f"account_age_days must be an integer; got {data['account_age_days']!r}"
            raise ValueError(msg)
        amount_part = min(data["amount_cny"] / 100_000, 1.0)
        age_part = 1.0 / (1 + data.get("account_age_days", 365) / 30)
        data["fraud_score"] = round(0.7 * amount_part + 0.3 * age_part, 4)
        out.append(e.replace(data=data))
    return out
