"""What EventBus must know of the broker behind a bootstrap address: whether it is Tansu.

Apache Kafka (and every broker that assigns offsets as it appends: Redpanda, MSK, Confluent)
never shows a consumer a later record before an earlier one of the same partition, so a gap in
a partition's offsets is real: a transaction marker, an aborted transaction's records (skipped
by ``read_committed``), a compacted record. Readers pass such gaps at once.

Tansu, the embedded default's broker, reserves a batch's offsets before it stores the batch:
while two producers write one partition, a fetch can return a later batch before an earlier one
exists, and a reader that took it would skip the earlier batch for good. Only there do readers
wait for a gap to fill (:class:`~eventbus.eventing.sources._kafka_gaps.OffsetGaps`).

Tansu names itself by its cluster id (``tansu_cluster`` unless its ``--cluster-id`` says
otherwise), which every Kafka client reads in the Metadata answer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eventbus.eventing._kafka_client import KafkaClientConfig

__all__ = ["TANSU_CLUSTER_ID", "gap_wait_s", "is_tansu"]

log = logging.getLogger(__name__)

#: The cluster id Tansu reports unless told otherwise (``tansu broker --cluster-id``).
TANSU_CLUSTER_ID = "tansu_cluster"

# bootstrap -> whether it is Tansu (a process asks once; two first askers at once both ask)
_known: dict[str, bool] = {}


async def is_tansu(
    bootstrap: str, client: KafkaClientConfig | None = None, *, timeout_s: float = 10.0
) -> bool:
    """Whether the broker at ``bootstrap`` is Tansu (its cluster id says so).

    Asked once per process and bootstrap; a broker that cannot be asked is taken as not Tansu
    (the caller's own connection then reports why it cannot be reached).
    """
    if bootstrap in _known:
        return _known[bootstrap]
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    from eventbus.eventing._kafka_client import kafka_client_kwargs

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=int(timeout_s * 1000),
        **kafka_client_kwargs(client),
    )
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        cluster = await asyncio.wait_for(admin.describe_cluster(), timeout_s)
    except (KafkaError, OSError, TimeoutError, KeyError) as e:
        log.warning("could not read the cluster id of %s (%s); taking it as Kafka", bootstrap, e)
        return False
    finally:
        await admin.close()
    _known[bootstrap] = cluster.get("cluster_id") == TANSU_CLUSTER_ID
    return _known[bootstrap]


async def gap_wait_s(
    configured_ms: int | None,
    bootstrap: str,
    client: KafkaClientConfig | None = None,
    *,
    on_tansu_s: float = 1.0,
) -> float:
    """How long a reader waits for a gap in a partition's offsets to fill, in seconds.

    Args:
        configured_ms: the reader's own setting; None: decided by the broker.
        bootstrap: the broker.
        client: its connection settings.
        on_tansu_s: the wait on Tansu when ``configured_ms`` is None.

    Returns:
        ``configured_ms`` when given; else ``on_tansu_s`` on Tansu and 0 on any other broker
        (its gaps are real and passed at once).
    """
    if configured_ms is not None:
        return configured_ms / 1000
    return on_tansu_s if await is_tansu(bootstrap, client) else 0.0
