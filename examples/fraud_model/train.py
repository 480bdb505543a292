"""Train the example fraud scorer on a synthetic data set (deterministic, a few seconds on CPU).

    .venv/bin/python examples/fraud_model/train.py [--out DIR] [--seed 0] [--epochs 300]

Writes to DIR (default: beside this file):
  fraud.pt2          the model as a torch.export program (what fraud.yaml serves)
  fraud_state.pt     its state_dict (push it with --factory model:build)
  holdout.npz        labelled samples x, y (push them with --samples for the accuracy check)

Data: 8 features per transaction (model.FEATURES); the label is drawn from a logistic rule
(large, foreign, card-not-present, fast-moving payments on young accounts are risky) so the
scorer has something real to learn. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from model import build  # noqa: E402


def make_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    u = lambda: torch.rand(n, generator=g)  # noqa: E731
    log_amount = 1 + 3 * u()
    hour = u()
    account_age = 3.5 * u()
    tx_24h = torch.poisson(torch.full((n,), 1.5), generator=g) / 10
    foreign = (u() < 0.15).float()
    card_present = (u() < 0.6).float()
    velocity = torch.exp(torch.randn(n, generator=g) * 0.8)
    risky = (u() < 0.1).float()
    x = torch.stack(
        [log_amount, hour, account_age, tx_24h, foreign, card_present, velocity, risky], dim=1
    )
    night = ((hour < 0.25) | (hour > 0.9)).float()
    logit = (
        -4.0
        + 1.1 * (log_amount - 2.5)
        - 0.9 * account_age
        + 2.0 * tx_24h
        + 1.8 * foreign
        - 1.5 * card_present
        + 0.9 * (velocity - 1)
        + 1.6 * risky
        + 0.8 * night
        + 2.5
    )
    y = (u() < torch.sigmoid(logit)).float()
    return x, y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=300)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # deterministic and quick
    x, y = make_data(6000, args.seed)
    xtr, ytr, xte, yte = x[:5000], y[:5000], x[5000:], y[5000:]
    model = build()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    loss_fn = torch.nn.BCELoss()
    for _ in range(args.epochs):
        opt.zero_grad()
        loss = loss_fn(model(xtr).squeeze(1), ytr)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        acc = float(((model(xte).squeeze(1) > 0.5).float() == yte).float().mean())
    args.out.mkdir(parents=True, exist_ok=True)
    ep = torch.export.export(
        model, (xte[:4].clone(),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    torch.export.save(ep, args.out / "fraud.pt2")
    torch.save(model.state_dict(), args.out / "fraud_state.pt")
    import numpy as np

    np.savez(args.out / "holdout.npz", x=xte.numpy(), y=yte.numpy())
    print(
        f"trained: loss {float(loss.detach()):.4f}, holdout accuracy {acc:.4f} (base rate {float(yte.mean()):.3f}); wrote {args.out}/fraud.pt2"
    )


if __name__ == "__main__":
    main()
