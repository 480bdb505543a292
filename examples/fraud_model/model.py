"""The fraud scorer's module: a small MLP over 8 transaction features (see train.py)."""

from __future__ import annotations

from typing import Any

FEATURES = [
    "log_amount",  # log10 of the amount in CNY
    "hour",  # hour of day / 24
    "account_age",  # log10(1 + account age in days)
    "tx_24h",  # transactions of the card in the last 24 h / 10
    "foreign",  # 1 when the card's country differs from the merchant's
    "card_present",  # 1 for a chip/contactless payment
    "velocity",  # amount relative to the card's 30-day mean
    "risky_merchant",  # 1 for a merchant category with a high fraud rate
]


def build() -> Any:
    """The untrained module (a factory: ``eventbus model push fraud STATE --factory model:build``)."""
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(len(FEATURES), 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 1),
        torch.nn.Sigmoid(),
    )
