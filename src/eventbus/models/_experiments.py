"""The registry's records of live experiments: shadow versions and their comparisons, automatic
rollbacks, and the model's history of both (a mixin of :class:`ModelRegistry`).

Keys (beside those of :mod:`eventbus.models._registry`, in the model's hash tag)::

    eventbus:models:<name>                 hash: shadow (JSON {"version", "share", "started_at"}),
                                           rolled_back:<N> (JSON record of N's rollback)
    eventbus:models:<name>:shadow:<N>      hash: comparison counters of version N's experiment
    eventbus:models:<name>:history         list: JSON records, newest first (at most 200)
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, cast

from eventbus._internal import keys
from eventbus.errors import ModelError
from eventbus.models._compare import summarize

__all__ = ["ExperimentRecords"]

_HISTORY = 200

# KEYS: the model's hash, its history. ARGV: kind ('split' | 'serving'), bad version, version to
# serve, the history record, the rolled_back:<bad> record, the last history index kept. Switches only if `bad` still holds
# what is judged: two replicas judging at once, or a push meanwhile, switch nothing twice.
_ROLLBACK = """
if ARGV[1] == 'split' then
  local s = redis.call('HGET', KEYS[1], 'split')
  if not s or cjson.decode(s)['version'] ~= tonumber(ARGV[2]) then return 0 end
  redis.call('HDEL', KEYS[1], 'split')
else
  if redis.call('HGET', KEYS[1], 'serving') ~= ARGV[2] then return 0 end
  redis.call('HSET', KEYS[1], 'serving', ARGV[3])
end
redis.call('HSET', KEYS[1], 'rolled_back:' .. ARGV[2], ARGV[5])
redis.call('HINCRBY', KEYS[1], 'revision', 1)
redis.call('LPUSH', KEYS[2], ARGV[4])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[6]))
return 1
"""


# KEYS: the experiment's comparison hash. ARGV: its started_at, the absolute-difference sum,
# then field, increment pairs. Adds only while the hash is that experiment's (a replica's last
# flush of a stopped or replaced experiment must not land in the next one of the version).
_ADD_COMPARISON = """
local s = redis.call('HGET', KEYS[1], 'started_at')
if not s or tonumber(s) ~= tonumber(ARGV[1]) then return 0 end
for i = 3, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
if tonumber(ARGV[2]) ~= 0 then redis.call('HINCRBYFLOAT', KEYS[1], 'abs_sum', ARGV[2]) end
return 1
"""


class ExperimentRecords:
    """Shadow experiments, rollbacks and history (needs ``_r``, ``record``, ``state``, ``mark``
    of :class:`ModelRegistry`)."""

    _r: Any

    def record(
        self, name: str, version: int
    ) -> dict[str, Any]:  # pragma: no cover - see ModelRegistry
        raise NotImplementedError

    def state(self, name: str) -> dict[str, Any]:  # pragma: no cover - see ModelRegistry
        raise NotImplementedError

    def mark(
        self, name: str, version: int, status: str, error: str | None = None
    ) -> None:  # pragma: no cover
        raise NotImplementedError

    # -- shadow -------------------------------------------------------------------------------
    def set_shadow(self, name: str, version: int | None, share: float = 0.2) -> dict[str, Any]:
        """Mirror ``share`` of the model's rows to ``version`` (None stops the experiment);
        returns the shadow setting (or None).

        Raises:
            ModelError: unknown or rejected version, the serving version, or a share outside
                (0, 1].
        """
        key = keys.model(name)
        now = time.time()
        current = self.state(name).get("shadow")
        if version is None:
            pipe = self._r.pipeline(transaction=True)
            pipe.hdel(key, "shadow")
            pipe.hincrby(key, "revision", 1)
            if current:
                pipe.hset(keys.model_shadow(name, int(current["version"])), "stopped_at", now)
            pipe.execute()
            if current:
                self._history(
                    name, {"at": now, "kind": "shadow-stop", "version": current["version"]}
                )
            return {"shadow": None}
        if not (isinstance(share, int | float) and math.isfinite(share) and 0.0 < share <= 1.0):
            msg = f"shadow share {share!r} is outside (0, 1]; give the fraction of calls to mirror to version {version}, e.g. 0.2"
            raise ModelError(msg)
        rec = self.record(name, version)
        if rec["status"] == "rejected":
            msg = f"model {name!r} version {version} was rejected ({rec['error']}); shadow a version that loads and validates"
            raise ModelError(msg)
        if version == self.state(name)["serving"]:
            msg = f"version {version} of model {name!r} already serves; shadow another version against it"
            raise ModelError(msg)
        setting = {"version": version, "share": float(share), "started_at": now}
        fig = keys.model_shadow(name, version)
        pipe = self._r.pipeline(transaction=True)
        pipe.delete(fig)
        pipe.hset(fig, mapping={"version": version, "share": float(share), "started_at": now})
        pipe.hset(key, "shadow", json.dumps(setting))
        pipe.hincrby(key, "revision", 1)
        if current and int(current["version"]) != version:
            pipe.hset(keys.model_shadow(name, int(current["version"])), "stopped_at", now)
        pipe.execute()
        self._history(name, {"at": now, "kind": "shadow-start", "version": version, "share": share})
        return {"shadow": setting}

    def add_comparison(
        self,
        name: str,
        version: int,
        ints: dict[str, int],
        abs_sum: float,
        *,
        started_at: float | None = None,
    ) -> bool:
        """Add a replica's comparison counters (:meth:`Comparison.take`) to the experiment's;
        with ``started_at``, only to the experiment that started then (False, nothing added,
        when the version's record is another experiment's now)."""
        if not ints and not abs_sum:
            return True
        fig = keys.model_shadow(name, version)
        if started_at is not None:
            args: list[Any] = [repr(float(started_at)), repr(float(abs_sum))]
            for k, v in ints.items():
                args += [k, int(v)]
            return bool(int(self._r.eval(_ADD_COMPARISON, 1, fig, *args)))
        pipe = self._r.pipeline(transaction=False)
        for k, v in ints.items():
            pipe.hincrby(fig, k, int(v))
        if abs_sum:
            pipe.hincrbyfloat(fig, "abs_sum", float(abs_sum))
        pipe.execute()
        return True

    def comparison(self, name: str, version: int) -> dict[str, Any] | None:
        """The figures of version's shadow experiment (:func:`summarize`), or None."""
        raw = cast("dict[bytes, bytes]", self._r.hgetall(keys.model_shadow(name, version)))
        return summarize(raw) if raw else None

    # -- rollback -----------------------------------------------------------------------------
    def rollback(
        self,
        name: str,
        *,
        kind: str,
        bad: int,
        to: int,
        reason: str,
        figures: dict[str, Any],
    ) -> bool:
        """Roll ``bad`` back: end its split (``kind='split'``) or serve ``to`` again
        (``kind='serving'``), record why; False when ``bad`` no longer holds that place
        (another replica or a push got there first)."""
        now = time.time()
        entry = {
            "at": now,
            "kind": "rollback",
            "from": kind,
            "version": bad,
            "to": to,
            "reason": reason,
            "figures": figures,
        }
        done = self._r.eval(
            _ROLLBACK,
            2,
            keys.model(name),
            keys.model_history(name),
            kind,
            str(bad),
            str(to),
            json.dumps(entry),
            json.dumps({"at": now, "to": to, "reason": reason}),
            str(_HISTORY - 1),
        )
        if not int(done):
            return False
        self.mark(name, bad, "rolled-back", f"rolled back to version {to}: {reason}")
        if kind == "serving":
            self.mark(name, to, "serving")
        return True

    def rolled_back(self, name: str, version: int) -> bool:
        """Whether ``version`` was rolled back automatically."""
        return bool(self._r.hexists(keys.model(name), f"rolled_back:{version}"))

    def history(self, name: str, limit: int = _HISTORY) -> list[dict[str, Any]]:
        """Rollbacks and shadow experiments of the model, newest first (unreadable records
        are shown as such, not skipped)."""
        out = []
        for raw in cast("list[bytes]", self._r.lrange(keys.model_history(name), 0, limit - 1)):
            try:
                out.append(json.loads(raw))
            except ValueError:
                out.append({"kind": "unreadable", "raw": raw[:200].decode(errors="replace")})
        return out

    def _history(self, name: str, entry: dict[str, Any]) -> None:
        pipe = self._r.pipeline(transaction=False)
        pipe.lpush(keys.model_history(name), json.dumps(entry))
        pipe.ltrim(keys.model_history(name), 0, _HISTORY - 1)
        pipe.execute()
