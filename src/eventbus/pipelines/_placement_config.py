"""``serving.placement``: which Ray nodes (hosts) a pipeline's replicas may use, and whether
they spread over them.

``node_labels`` become the replicas' Ray ``label_selector`` (a node started with
``ray start --labels zone=eu-1``, or ``eventbus up --labels``); ``spread: true`` sets Serve's
``max_replicas_per_node: 1``, so a lost host takes one replica, not all. The deploy checks both
against the live nodes (``serving/_placement.py``) and refuses what no node can hold.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

__all__ = ["LABEL_KEY", "PlacementConfig", "label_matches"]

#: a label key: an optional DNS-style prefix and a name, as Ray (and Kubernetes) take them
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_VALUE = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
#: a value Ray's label selector takes: v, !v, in(a,b), !in(a,b)
_SELECTOR = re.compile(rf"^(!?{_VALUE}|!?in\({_VALUE}(,\s*{_VALUE})*\))$")


class PlacementConfig(BaseModel):
    """Where the replicas run."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    spread: bool = Field(
        default=False,
        description="At most one replica of this pipeline per Ray node (Serve's "
        "max_replicas_per_node: 1): losing a host loses one replica. The deploy is refused when "
        "fewer live nodes match than replicas.min.",
    )
    node_labels: dict[
        Annotated[str, StringConstraints(pattern=LABEL_KEY)],
        Annotated[str, StringConstraints(max_length=400)],
    ] = Field(
        default_factory=dict,
        description="Only Ray nodes with these labels (Ray's label_selector: 'v', '!v', "
        "'in(a,b)', '!in(a,b)'); nodes get labels from `ray start --labels k=v` or `eventbus up "
        "--labels k=v`. The deploy is refused when no live node matches.",
    )

    @field_validator("node_labels")
    @classmethod
    def _values(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            if not _SELECTOR.match(value):
                msg = (
                    f"serving.placement.node_labels.{key} is {value!r}: not a label selector; "
                    "give a value ('eu-1'), its negation ('!eu-1') or a set ('in(eu-1,eu-2)', "
                    "'!in(eu-1,eu-2)'); values are letters, digits, '-', '_' and '.', at most 63"
                )
                raise ValueError(msg)
        return labels


def label_matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Whether a node with ``labels`` satisfies ``selector`` (Ray's label selector rules)."""
    for key, want in selector.items():
        have = labels.get(key)
        negate = want.startswith("!")
        body = want[1:] if negate else want
        if body.startswith("in(") and body.endswith(")"):
            allowed = {v.strip() for v in body[3:-1].split(",")}
            hit = have in allowed
        else:
            hit = have == body
        if hit == negate:
            return False
    return True
