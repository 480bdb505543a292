"""The model registry in Redis: versions, their artifacts, which one serves, the A/B split.

Keys (``<name>`` is the model's name; spelled by :mod:`eventbus._internal.keys`)::

    eventbus:models                      set of model names
    eventbus:models:<name>               hash: next (version counter), serving, split (JSON
                                         {"version", "weight"}), revision (bumped on every
                                         serving change; replicas poll it), options (JSON),
                                         min_accuracy, v:<N> (JSON record of version N)
    eventbus:models:<name>:blob:<N>      the artifact's bytes (any node's replicas load it)
    eventbus:models:<name>:recent        ring of recent request samples (.npy bytes, newest first)
    eventbus:models:<name>:labelled      labelled samples (.npz bytes with x and y)

A version record: ``{version, format, factory, size, sha256, pushed_at, source, status,
error, input_shape, python_path}`` with status ``candidate`` (pushed, not validated), ``serving``,
``retired`` (served before), ``rejected`` (failed validation; ``error`` says why), or
``rolled-back`` (rolled back automatically on a live regression; ``error`` says why). Shadow
experiments, rollbacks and the history: :mod:`eventbus.models._experiments`.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from typing import Any, NoReturn, cast

from eventbus._internal import keys
from eventbus.errors import ModelError
from eventbus.models._experiments import ExperimentRecords

__all__ = ["RECENT_ROWS", "ModelRegistry"]

RECENT_ROWS = 64  # rows per recorded sample
_RECENT_SAMPLES = 16  # samples kept: up to 1,024 recent request rows


class ModelRegistry(ExperimentRecords):
    """Model versions in Redis (see the module docstring for the keys).

    Args:
        redis_url: the Redis server.

    Example:
        >>> reg = ModelRegistry("redis://127.0.0.1:6379/0")  # doctest: +SKIP
        >>> v = reg.add_version("fraud", open("fraud.pt2", "rb").read())  # doctest: +SKIP
    """

    def __init__(self, redis_url: str) -> None:
        from eventbus._internal.redis_client import connect

        self.redis_url = redis_url
        # No decode_responses: every reply is bytes (redis's types say ``bytes | str``).
        self._r = connect(redis_url, socket_timeout=10)

    # -- versions ---------------------------------------------------------------------------
    def add_version(
        self,
        name: str,
        blob: bytes,
        *,
        format: str,
        factory: str | None = None,
        source: str = "",
        input_shape: tuple[int, ...] | None = None,
        python_path: list[str] | None = None,
    ) -> int:
        """Store an artifact as a new ``candidate`` version; returns its number."""
        key = keys.model(name)
        version = int(self._r.hincrby(key, "next", 1))
        record = {
            "version": version,
            "format": format,
            "factory": factory,
            "size": len(blob),
            "sha256": hashlib.sha256(blob).hexdigest(),
            "pushed_at": time.time(),
            "source": source,
            "status": "candidate",
            "error": None,
            "input_shape": list(input_shape) if input_shape else None,
            "python_path": list(python_path or []),
        }
        pipe = self._r.pipeline(transaction=True)
        pipe.set(keys.model_blob(name, version), blob)
        pipe.hset(key, f"v:{version}", json.dumps(record))
        pipe.execute()
        # The name set has its own slot in a Redis Cluster (the model's keys share the
        # model's hash tag): listed once the version is stored, so a listed model has one.
        self._r.sadd(keys.MODELS, name)
        return version

    def exists(self, name: str) -> bool:
        """Whether the model has any version."""
        return bool(self._r.hexists(keys.model(name), "next"))

    def names(self) -> list[str]:
        """Every model name, sorted."""
        return sorted(n.decode() for n in cast("set[bytes]", self._r.smembers(keys.MODELS)))

    def record(self, name: str, version: int) -> dict[str, Any]:
        """One version's record.

        Raises:
            ModelError: no such model or version.
        """
        raw = self._r.hget(keys.model(name), f"v:{version}")
        if raw is None:
            self._unknown(name, version)
        return json.loads(raw)  # type: ignore[no-any-return]

    def versions(self, name: str) -> list[dict[str, Any]]:
        """Every version's record, oldest first."""
        raw = cast("dict[bytes, bytes]", self._r.hgetall(keys.model(name)))
        recs = [json.loads(v) for k, v in raw.items() if k.startswith(b"v:")]
        return sorted(recs, key=lambda r: r["version"])

    def blob(self, name: str, version: int) -> bytes:
        """A version's artifact bytes, checked against the sha256 recorded when it was pushed.

        Raises:
            ModelError: no such model or version, or the bytes' digest is not the recorded one
                (changed in Redis after the push): the version must not be served.
        """
        data = cast("bytes | None", self._r.get(keys.model_blob(name, version)))
        if data is None:
            self._unknown(name, version)
        recorded = self.record(name, version).get("sha256")
        actual = hashlib.sha256(data).hexdigest()
        if recorded is not None and actual != recorded:
            msg = (
                f"model {name!r} version {version}: the stored artifact's sha256 is {actual}, "
                f"but {recorded} was recorded when it was pushed; its bytes changed in Redis "
                "(tampering or corruption), so it is not loaded or served; push the model "
                "file again as a new version"
            )
            raise ModelError(msg)
        return data

    def mark(self, name: str, version: int, status: str, error: str | None = None) -> None:
        """Set a version's status (and error)."""
        rec = self.record(name, version)
        rec["status"], rec["error"] = status, error
        self._r.hset(keys.model(name), f"v:{version}", json.dumps(rec))

    # -- what serves ------------------------------------------------------------------------
    def state(self, name: str) -> dict[str, Any]:
        """``{"serving": int | None, "split": {"version", "weight"} | None, "shadow":
        {"version", "share", "started_at"} | None, "revision": int}``."""
        serving, split, shadow, revision = self._r.hmget(
            keys.model(name), "serving", "split", "shadow", "revision"
        )
        return {
            "serving": int(serving) if serving else None,
            "split": json.loads(split) if split else None,
            "shadow": json.loads(shadow) if shadow else None,
            "revision": int(revision or 0),
        }

    def set_serving(self, name: str, version: int) -> None:
        """Make ``version`` the serving one (the previous one becomes ``retired``); a split
        or a shadow experiment of ``version`` ends."""
        previous = self.state(name)["serving"]
        self.record(name, version)
        pipe = self._r.pipeline(transaction=True)
        pipe.hset(keys.model(name), "serving", version)
        st = self.state(name)
        if st["split"] and st["split"]["version"] == version:
            pipe.hdel(keys.model(name), "split")
        if st["shadow"] and st["shadow"]["version"] == version:
            pipe.hdel(keys.model(name), "shadow")
        pipe.hincrby(keys.model(name), "revision", 1)
        pipe.execute()
        self.mark(name, version, "serving")
        if previous is not None and previous != version:
            self.mark(name, previous, "retired")

    def set_split(self, name: str, version: int | None, weight: float = 0.0) -> None:
        """Send ``weight`` of the traffic (by event id) to ``version``, the rest to the serving
        version; ``version=None`` ends the split.

        Raises:
            ModelError: unknown or rejected version, or a weight outside [0, 1].
        """
        key = keys.model(name)
        if version is None:
            pipe = self._r.pipeline(transaction=True)
            pipe.hdel(key, "split")
            pipe.hincrby(key, "revision", 1)
            pipe.execute()
            return
        if not 0.0 <= weight <= 1.0:
            msg = f"split weight {weight!r} is outside [0, 1]; give the fraction of events for version {version}, e.g. 0.1"
            raise ModelError(msg)
        rec = self.record(name, version)
        if rec["status"] == "rejected":
            msg = f"model {name!r} version {version} was rejected ({rec['error']}); push a fixed version instead"
            raise ModelError(msg)
        pipe = self._r.pipeline(transaction=True)
        pipe.hset(key, "split", json.dumps({"version": version, "weight": weight}))
        pipe.hincrby(key, "revision", 1)
        pipe.execute()

    def options(self, name: str) -> dict[str, Any]:
        """The model deployment's settings, as last deployed."""
        raw = self._r.hget(keys.model(name), "options")
        return json.loads(raw) if raw else {}

    def set_options(self, name: str, options: dict[str, Any]) -> None:
        self._r.hset(keys.model(name), "options", json.dumps(options, sort_keys=True))

    def called(self, name: str) -> None:
        """Record that the model was just called (its idle time, ``_model_zero``)."""
        self._r.hset(keys.model(name), "called_at", repr(time.time()))

    def pool_options(self, pool: str) -> dict[str, Any] | None:
        """A model pool's settings as last deployed (None: never deployed)."""
        raw = self._r.hget(keys.MODEL_POOLS, pool)
        return json.loads(raw) if raw else None

    def set_pool_options(self, pool: str, options: dict[str, Any]) -> None:
        self._r.hset(keys.MODEL_POOLS, pool, json.dumps(options, sort_keys=True))

    # -- validation data --------------------------------------------------------------------
    def record_inputs(self, name: str, rows: Any) -> None:
        """Keep a sample of recent request rows (a numpy array) for validating new versions."""
        import numpy as np

        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(rows[:RECENT_ROWS]), allow_pickle=False)
        key = keys.model_recent(name)
        pipe = self._r.pipeline(transaction=False)
        pipe.lpush(key, buf.getvalue())
        pipe.ltrim(key, 0, _RECENT_SAMPLES - 1)
        pipe.execute()

    def recent_inputs(self, name: str, row_shape: tuple[int, ...] | None = None) -> Any | None:
        """The recorded recent rows as one array (those of ``row_shape`` when given), or None."""
        import numpy as np

        arrays = [
            np.load(io.BytesIO(b), allow_pickle=False)
            for b in cast("list[bytes]", self._r.lrange(keys.model_recent(name), 0, -1))
        ]
        if arrays and row_shape is None:
            row_shape = arrays[0].shape[1:]
        arrays = [a for a in arrays if a.shape[1:] == tuple(row_shape or ())]
        return np.concatenate(arrays) if arrays else None

    def set_labelled(self, name: str, x: Any, y: Any, min_accuracy: float | None) -> None:
        """Labelled samples (numpy arrays) every new version is scored on, and the threshold."""
        import numpy as np

        buf = io.BytesIO()
        np.savez(buf, x=x, y=y)
        pipe = self._r.pipeline(transaction=True)
        pipe.set(keys.model_labelled(name), buf.getvalue())
        if min_accuracy is None:
            pipe.hdel(keys.model(name), "min_accuracy")
        else:
            pipe.hset(keys.model(name), "min_accuracy", repr(float(min_accuracy)))
        pipe.execute()

    def labelled(self, name: str) -> tuple[Any, Any, float | None] | None:
        """``(x, y, min_accuracy)`` or None."""
        import numpy as np

        raw = cast("bytes | None", self._r.get(keys.model_labelled(name)))
        if raw is None:
            return None
        z = np.load(io.BytesIO(raw), allow_pickle=False)
        thr = self._r.hget(keys.model(name), "min_accuracy")
        return z["x"], z["y"], float(thr) if thr else None

    def _unknown(self, name: str, version: int) -> NoReturn:
        if not self.exists(name):
            known = ", ".join(self.names()) or "none"
            msg = f"no model named {name!r} in the registry (models: {known}); push one with `eventbus model push {name} PATH`"
        else:
            have = ", ".join(str(r["version"]) for r in self.versions(name))
            msg = f"model {name!r} has no version {version} (versions: {have}); `eventbus model list {name}` shows them"
        raise ModelError(msg)
