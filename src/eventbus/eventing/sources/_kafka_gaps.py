"""Offset gaps: a partition's fetched records are taken only up to the first gap in their
offsets, and the gap is fetched again until it fills (Tansu stores concurrent producers'
batches out of order). Used by the Kafka source's fetcher, the topic tail and the redrive.
"""

from __future__ import annotations

import logging
from typing import Any

from aiokafka import TopicPartition

__all__ = ["OffsetGaps"]

# One logger for every part of the Kafka source, as when it was one module.
log = logging.getLogger("eventbus.eventing.sources._kafka")


class OffsetGaps:
    """Takes each partition's fetched records only up to the first gap in their offsets, and
    seeks back to the gap so that it is fetched again.

    On Tansu a batch's offsets are reserved before the batch is stored, so while two
    producers write one partition a fetch can return a later batch before an earlier one
    exists: a consumer that took it would skip the earlier batch for good. A gap still there
    after ``wait_s`` is taken as real and passed, with a warning. On Apache Kafka every gap is
    real (transaction markers, aborted records, compaction) and ``wait_s`` is 0: nothing is
    held (:func:`eventbus.eventing._broker.gap_wait_s` decides).

    Args:
        wait_s: how long a gap is waited for (0: gaps are passed at once).
        name: who consumes, for the warning.
    """

    def __init__(self, wait_s: float, name: str) -> None:
        self.wait_s = wait_s
        self.name = name
        self._expected: dict[TopicPartition, int] = {}  # next offset, per partition
        self._since: dict[TopicPartition, tuple[int, float]] = {}  # missing offset, first seen
        #: fetches whose records were cut at a gap and fetched again (0 on Apache Kafka)
        self.holds = 0

    def reset(self) -> None:
        """Forget the partitions' positions (after a rebalance or a seek elsewhere)."""
        self._expected.clear()
        self._since.clear()

    def take(
        self, consumer: Any, data: dict[TopicPartition, list[Any]], now: float
    ) -> tuple[dict[TopicPartition, list[Any]], bool]:
        """The records to take now, and whether some partition is held at a gap."""
        if self.wait_s <= 0:  # every gap is real (Apache Kafka): nothing to look at
            return data, False
        out: dict[TopicPartition, list[Any]] = {}
        held = False
        for tp, recs in data.items():
            if not recs:
                continue
            expected = self._expected.get(tp)
            cut = None
            first, last = recs[0].offset, recs[-1].offset
            if (expected is None or first <= expected) and last - first == len(recs) - 1:
                expected = last + 1  # the usual case: no gap (offsets only increase)
            else:
                for i, r in enumerate(recs):
                    if expected is not None and r.offset > expected:
                        cut = i
                        break
                    expected = r.offset + 1
            if cut is None:
                self._since.pop(tp, None)
            else:
                assert expected is not None
                since = self._since.get(tp)
                if since is None or since[0] != expected:
                    since = self._since[tp] = (expected, now)
                if now - since[1] < self.wait_s:
                    recs = recs[:cut]
                    consumer.seek(tp, expected)
                    held = True
                    self.holds += 1
                else:
                    log.warning(
                        "%s: %s[%d] has no records at offsets %d-%d after %.1f s; passing them "
                        "(a compacted or transactional topic? set offset_gap_wait_ms: 0 for it)",
                        self.name,
                        tp.topic,
                        tp.partition,
                        expected,
                        recs[cut].offset - 1,
                        now - since[1],
                    )
                    del self._since[tp]
            if recs:
                out[tp] = recs
                self._expected[tp] = recs[-1].offset + 1
        return out, held
