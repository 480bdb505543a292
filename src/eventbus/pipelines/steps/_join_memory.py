"""The join states in process memory (pipeline tests, ``eventbus test``): the semantics of
the Redis scripts of :mod:`._join_state` (``emit: first``, mode latest) and
:mod:`._join_pairs` (``emit: every``/``latest``), without a stack."""

from __future__ import annotations

from collections.abc import Sequence

from eventbus.pipelines.steps._join_pairs import Item, PairItem, PairState, split_field
from eventbus.pipelines.steps._join_state import AFTER_MATCH, EVICTED, SUPERSEDED, WAITING
from eventbus.pipelines.steps._join_watermark import PROCESSING, Clock, Watermark

__all__ = ["MemoryJoinState", "MemoryPairState"]


class MemoryJoinState:
    """The same semantics in process memory (pipeline tests without a stack)."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[str, bytes]] = {}
        self.due: dict[str, int] = {}
        self.claimed: dict[str, int] = {}
        self.watermark: Watermark | None = None

    def _watermark(self, clock: Clock) -> Watermark:
        if self.watermark is None:
            self.watermark = Watermark(clock.idle_ms)
        return self.watermark

    def join(
        self,
        now_ms: int,
        window_ms: int,
        nsides: int,
        max_pending: int,
        items: Sequence[Item],
        clock: Clock = PROCESSING,
    ) -> list[dict[str, bytes] | int]:
        out: list[dict[str, bytes] | int] = []
        wm = self._watermark(clock)
        w0 = wm.read(now_ms) if clock.event else None
        lateness = clock.lateness_ms
        seen: list[tuple[str, int]] = []
        for k, side, payload, eid, t, lane in items:
            by = f"{side}/{eid}".encode()
            h = self.hashes.get(k)
            if h is not None and "__done" in h:
                out.append(dict(h) if h.get("__by") == by else AFTER_MATCH)
                continue
            if (
                w0 is not None
                and t + window_ms + lateness < w0
                and (h is None or h.get(side) != payload)
            ):
                out.append(-w0)
                continue
            if clock.event and (h is None or "__evicted" not in h):
                seen.append((lane, t))
            if h is None:
                h = self.hashes[k] = {"__t0": str(t).encode()}
                self.due[k] = t + window_ms + lateness
            replaced = side in h
            h[side] = payload
            if "__evicted" in h:
                out.append(EVICTED)
            elif len(h) - 1 >= nsides:
                h["__done"] = b"1"
                h["__by"] = by
                self.due.pop(k, None)
                out.append(dict(h))
            else:
                out.append(SUPERSEDED if replaced else WAITING)
        if clock.event:
            wm.advance(seen, now_ms)
        over = len(self.due) - max_pending
        if over > 0:
            for k in sorted(self.due, key=self.due.__getitem__)[:over]:
                self.hashes[k]["__evicted"] = b"1"
                self.due[k] = 0
        return out

    def latest(
        self,
        window_ms: int,
        table: str,
        items: Sequence[Item],
        now_ms: int = 0,
        clock: Clock = PROCESSING,
    ) -> list[bytes | int | None]:
        out: list[bytes | int | None] = []
        wm = self._watermark(clock)
        w0 = wm.read(now_ms) if clock.event else None
        seen: list[tuple[str, int]] = []
        for k, side, payload, _, t, lane in items:
            if w0 is not None and t + window_ms + clock.lateness_ms < w0:
                out.append(-w0)
                continue
            seen.append((lane, t))
            if side == table:
                self.hashes.setdefault(k, {})[table] = payload
                out.append(None)
            else:
                out.append(self.hashes.get(k, {}).get(table))
        if clock.event:
            wm.advance(seen, now_ms)
        return out

    def claim_due(
        self, now_ms: int, lease_ms: int, limit: int, clock: Clock = PROCESSING
    ) -> list[tuple[str, dict[str, bytes]]]:
        upto = now_ms
        if clock.event:
            w = self._watermark(clock).advance((), now_ms)
            upto = -1 if w is None else w
        keys = [k for k, t in self.claimed.items() if t <= now_ms] + [
            k for k, t in self.due.items() if t <= upto
        ]
        out = []
        for k in keys[:limit]:
            self.due.pop(k, None)
            self.claimed[k] = now_ms + lease_ms
            out.append((k, dict(self.hashes.get(k, {}))))
        return out

    def ack(self, keys: Sequence[str]) -> None:
        for k in keys:
            self.claimed.pop(k, None)
            self.hashes.pop(k, None)

    def pending(self) -> int:
        return len(self.due)


class MemoryPairState(PairState):
    """The same semantics in process memory (pipeline tests without a stack)."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[str, bytes]] = {}
        self.due: dict[str, int] = {}
        self.claimed: dict[str, int] = {}
        self.watermark: Watermark | None = None

    def _watermark(self, clock: Clock) -> Watermark:
        if self.watermark is None:
            self.watermark = Watermark(clock.idle_ms)
        return self.watermark

    def _before(
        self, h: dict[str, bytes], side: str, seq: int
    ) -> tuple[int, list[tuple[str, int, bytes]]]:
        same, others = 0, []
        for f, v in h.items():
            if f.startswith("__"):
                continue
            item = split_field(f, v)
            if 0 < item[1] < seq:
                if f.partition("/")[0] == side:
                    same += 1
                else:
                    others.append(item)
        return same, others

    def add(
        self,
        now_ms: int,
        window_ms: int,
        max_pending: int,
        max_bytes: int,
        items: Sequence[Item],
        clock: Clock = PROCESSING,
    ) -> list[PairItem]:
        out: list[PairItem] = []
        lateness = clock.lateness_ms
        wm = self._watermark(clock)
        w0 = wm.read(now_ms) if clock.event else None
        seen: list[tuple[str, int]] = []
        for k, side, payload, eid, t, lane in items:
            f, m = f"{side}/{eid}", f"w:{k}"
            h = self.hashes.get(m)
            old = h.get(f) if h is not None else None
            if old is None and w0 is not None and t + window_ms + lateness < w0:
                out.append((-3, str(w0), 0, []))
                continue
            if clock.event and old is None:
                seen.append((lane, t))
            if h is not None and old is None and t >= int(h["__t0"]) + window_ms:
                x = f"x:{h['__t0'].decode()}:{k}"
                self.hashes[x] = self.hashes.pop(m)
                self.due.pop(m, None)
                if m in self.claimed:
                    self.claimed[x] = self.claimed.pop(m)
                else:
                    self.due[x] = int(h["__t0"]) + window_ms + lateness
                h = None
            if h is None:
                h = self.hashes[m] = {"__t0": str(t).encode(), "__n": b"0", "__b": b"0"}
                self.due[m] = t + window_ms + lateness
            t0 = h["__t0"].decode()
            if old is not None:
                seq = int(old.partition(b",")[0])
                out.append((2, t0, *self._before(h, side, seq)))
            elif "__evicted" in h:
                h[f] = b"0," + payload
                out.append((-1, t0, 0, []))
            elif int(h["__b"]) + len(payload) > max_bytes:
                out.append((-2, t0, int(h["__b"]), []))
            else:
                seq = int(h["__n"]) + 1
                h["__n"] = str(seq).encode()
                h["__b"] = str(int(h["__b"]) + len(payload)).encode()
                h[f] = str(seq).encode() + b"," + payload
                out.append((1, t0, *self._before(h, side, seq)))
        if clock.event:
            wm.advance(seen, now_ms)
        over = len(self.due) - max_pending
        if over > 0:
            for m in sorted(self.due, key=lambda m: (self.due[m], m))[:over]:
                self.hashes[m]["__evicted"] = b"1"
                self.due[m] = 0
        return out

    def claim_due(
        self,
        now_ms: int,
        lease_ms: int,
        limit: int,
        clock: Clock = PROCESSING,
        *,
        evicted_only: bool = False,
    ) -> list[tuple[str, dict[str, bytes]]]:
        upto = now_ms
        if clock.event:
            w = self._watermark(clock).advance((), now_ms)
            upto = -1 if w is None else w
        if evicted_only:  # (exactly_once runs on Redis state; this mirrors it)
            upto = 0
        names = [m for m, t in self.claimed.items() if t <= now_ms][:limit]
        names += [m for m, t in self.due.items() if t <= upto][:limit]
        out = []
        for m in names:
            self.due.pop(m, None)
            self.claimed[m] = now_ms + lease_ms
            out.append((m, dict(self.hashes.get(m, {}))))
        return out

    def ack(self, claimed: Sequence[tuple[str, str]]) -> None:
        for m, t0 in claimed:
            h = self.hashes.get(m)
            if m.startswith("w:") and (h is None or h["__t0"].decode() != t0):
                self.claimed.pop(m, None)
                m = f"x:{t0}:{m[2:]}"
            self.claimed.pop(m, None)
            self.hashes.pop(m, None)

    def pending(self) -> int:
        return len(self.due)
