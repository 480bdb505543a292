"""The Kafka transaction a delivery runs in (delivery guarantee ``exactly_once``).

A Kafka source delivering a batch transactionally sets :data:`CURRENT_PRODUCER` to the
transactional producer of the batch's input partition; a Kafka sink sends through it instead
of its own producer, so the outputs and dead letters join the batch's transaction. Unset (the
default), sinks use their own producers.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

__all__ = ["CURRENT_PRODUCER"]

#: The transactional producer of the delivery running in this context; None outside one.
CURRENT_PRODUCER: ContextVar[Any] = ContextVar("eventbus_txn_producer", default=None)
