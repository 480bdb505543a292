"""The gRPC transports: the gateways' ``eventbus.v1.EventBus`` service (gRPC imported on use)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eventbus._client._registry import ClusterInfo
from eventbus._client._router import Unavailable
from eventbus._client._transport import _refused
from eventbus.eventing._event import CloudEvent

__all__ = ["AsyncGrpcTransport", "GrpcTransport"]

PIPELINE_METADATA = "x-eventbus-pipeline"

# gRPC codes -> (HTTP status, fail over?). Mirrors eventbus.gateway._grpc.
_GRPC_STATUS = {
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 413,
    "FAILED_PRECONDITION": 422,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # A stopped gateway must be retried within seconds once back, not after gRPC's 2-minute cap.
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def _grpc_error(cluster: ClusterInfo, pipeline: str, exc: Any) -> Exception:
    code = exc.code().name if exc.code() is not None else "UNKNOWN"
    status = _GRPC_STATUS.get(code, 500)
    if status >= 500:
        return Unavailable(f"gRPC {code}: {exc.details()}", status=status)
    if status == 404:
        return Unavailable(f"gRPC NOT_FOUND: {exc.details()}", mark_down=False, status=404)
    return _refused(cluster, pipeline, status, f"{code}: {exc.details()}")


class _GrpcBase:
    def __init__(self, timeout_s: float, metadata: Mapping[str, str] | None, aio: bool) -> None:
        import grpc

        from eventbus.eventing._proto import eventbus_pb2_grpc

        self._grpc, self._stubs_mod, self._aio = grpc, eventbus_pb2_grpc, aio
        self.timeout_s = timeout_s
        self._metadata = tuple((k.lower(), v) for k, v in (metadata or {}).items())
        # cluster name -> (address, stub, channel); channels of a changed address wait in
        # _stale for close().
        self._channels: dict[str, tuple[str, Any, Any]] = {}
        self._stale: list[Any] = []

    def _stub(self, cluster: ClusterInfo) -> Any:
        if cluster.grpc is None:
            reason = f"cluster {cluster.name!r} has no gRPC address registered"
            raise Unavailable(reason, mark_down=False)
        got = self._channels.get(cluster.name)
        if got is None or got[0] != cluster.grpc:
            if got is not None:
                self._stale.append(got[2])
            factory = self._grpc.aio.insecure_channel if self._aio else self._grpc.insecure_channel
            channel = factory(cluster.grpc, options=_GRPC_OPTIONS)
            got = (cluster.grpc, self._stubs_mod.EventBusStub(channel), channel)  # type: ignore[no-untyped-call]
            self._channels[cluster.name] = got
        return got[1]

    def _all_channels(self) -> list[Any]:
        channels = [got[2] for got in self._channels.values()] + self._stale
        self._channels.clear()
        self._stale.clear()
        return channels

    def _meta(self, pipeline: str) -> tuple[tuple[str, str], ...]:
        return ((PIPELINE_METADATA, pipeline), *self._metadata)


class GrpcTransport(_GrpcBase):
    """gRPC (``eventbus.v1.EventBus``) to the gateways, one channel per cluster."""

    def __init__(self, timeout_s: float, metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(timeout_s, metadata, aio=False)

    def publish(self, cluster: ClusterInfo, pipeline: str, events: list[CloudEvent]) -> list[str]:
        from eventbus.eventing._protobuf import events_to_proto_batch

        try:
            self._stub(cluster).Publish(
                events_to_proto_batch(events), metadata=self._meta(pipeline), timeout=self.timeout_s
            )
        except self._grpc.RpcError as exc:
            raise _grpc_error(cluster, pipeline, exc) from None
        return [e.attributes["id"] for e in events]

    def invoke(self, cluster: ClusterInfo, pipeline: str, event: CloudEvent) -> list[CloudEvent]:
        from eventbus.eventing._protobuf import event_to_proto, events_from_proto_batch

        try:
            reply = self._stub(cluster).Invoke(
                event_to_proto(event), metadata=self._meta(pipeline), timeout=self.timeout_s
            )
        except self._grpc.RpcError as exc:
            raise _grpc_error(cluster, pipeline, exc) from None
        return events_from_proto_batch(reply)

    def close(self) -> None:
        for channel in self._all_channels():
            channel.close()


class AsyncGrpcTransport(_GrpcBase):
    """gRPC (``grpc.aio``) to the gateways, one channel per cluster."""

    def __init__(self, timeout_s: float, metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(timeout_s, metadata, aio=True)

    async def publish(
        self, cluster: ClusterInfo, pipeline: str, events: list[CloudEvent]
    ) -> list[str]:
        from eventbus.eventing._protobuf import events_to_proto_batch

        try:
            await self._stub(cluster).Publish(
                events_to_proto_batch(events), metadata=self._meta(pipeline), timeout=self.timeout_s
            )
        except self._grpc.RpcError as exc:
            raise _grpc_error(cluster, pipeline, exc) from None
        return [e.attributes["id"] for e in events]

    async def invoke(
        self, cluster: ClusterInfo, pipeline: str, event: CloudEvent
    ) -> list[CloudEvent]:
        from eventbus.eventing._protobuf import event_to_proto, events_from_proto_batch

        try:
            reply = await self._stub(cluster).Invoke(
                event_to_proto(event), metadata=self._meta(pipeline), timeout=self.timeout_s
            )
        except self._grpc.RpcError as exc:
            raise _grpc_error(cluster, pipeline, exc) from None
        return events_from_proto_batch(reply)

    async def close(self) -> None:
        for channel in self._all_channels():
            await channel.close()
