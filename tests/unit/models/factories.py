"""Model factories and combiners the unit tests name by import path."""

from __future__ import annotations

from typing import Any


def mlp() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def first_output(outputs: list[Any], weights: list[float]) -> Any:
    return outputs[0]
