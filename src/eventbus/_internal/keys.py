"""The Redis key layout: every key EventBus reads or writes, one constant or function each.

This module imports nothing from ``eventbus``, so every layer may use it. The key strings are
a storage format (``tests/unit/test_keys.py`` pins them). ``<pipeline>`` is a pipeline name
(``^[a-z][a-z0-9-]{0,47}$``), ``<step>`` a step id (``^[a-z][a-z0-9_]*$``), ``<name>`` a
model name. Pipeline names and step ids hold no ``:``, so no two families overlap.

Redis Cluster: the part of a key in ``{...}`` (its hash tag) alone picks its slot. Keys that
one Lua script or one ``MULTI`` transaction touches share a tag, so each touches one slot:
``{control}`` for the control plane, ``{<pipeline>:<step>}`` for a step's state,
``{<pipeline>}`` for a pipeline's dedupe marks, ``{<name>}`` for one model. Keys only ever
touched one at a time (the replay marks) carry no tag and spread over the cluster. The tags
came in with Redis Cluster support: state written by an earlier EventBus under the old
untagged names is not read back (see docs/how-to/upgrading.md).

Control plane (the controller, ``serving``):

* :data:`PIPELINES` (hash): pipeline name -> JSON record (name, version, document, YAML...).
* :data:`DEGRADED` (hash): pipeline name -> JSON reason of a pipeline whose topics are missing.
* :data:`HOSTS` (hash): host name -> JSON of the pipelines a shared host runs.
* :func:`pipeline_versions` (hash): version number -> JSON record of that version.
* :func:`canary` (string): JSON of a pipeline's running canary (YAML, schedule, weight...).
* :func:`canary_figures` (hash): replica id -> JSON of the canary's and the stable version's
  events, failures and step seconds.
* :func:`join_bridge` (string with a TTL): ``open``, then the id of the source that consumes
  a woken pipeline's consumer group by assignment while its group join runs.

Observability (replicas, source actors and gateways write; gateways and ``status`` read):

* :func:`stats` (hash): entry id (replica, source actor or gateway) -> JSON of its figures.
* :func:`history` (hash with a TTL): one 10-second bucket of a pipeline's last 15 minutes
  (events in/out/failed, latency histogram counts, each writer's lag and liveness); same hash
  tag as :func:`stats`, written with it in one round trip.

Delivery (``eventing``):

* :func:`dedupe_prefix` + digest (string ``1`` or a pending claim, with a TTL): an output
  event delivered (or being delivered) within the dedupe window.

Schedules (``eventing``, the schedule source):

* :func:`schedule` (hash ``owner``, ``until``, ``through``, ``emitted``, ``missed``, with a
  TTL): which replica holds a schedule's lease, until when, and the last tick emitted.

Gateway (``gateway``):

* :func:`replay` (string ``1`` with a TTL): a signed request's signature, seen within its
  replay window (each signed request is accepted once).

Step state (``pipelines``):

* :func:`join_prefix` + ``k:<key>`` (hash), ``due`` (sorted set), ``claim`` (sorted set):
  a join step's pending keys with ``emit: first``; ``w:<key>`` and ``x:<t0>:<key>`` (hashes),
  ``pdue``, ``pclaim`` (sorted sets): its windows with ``emit: every`` or ``latest``; ``wm``
  (hash): its event-time watermark per source partition (``time: event``) (the Lua scripts
  add the suffixes).
* :func:`aggregate_keys` (hash ``w``, sorted sets ``due`` and ``claim``, strings ``hll`` and
  ``hll2``): an aggregate step's open windows, their close deadlines and claims, and two
  scratch strings its scripts load HyperLogLogs into. All five share one hash tag
  ``{agg:<pipeline>:<step>}``, so the step's scripts declare them as KEYS and run on one
  Redis Cluster slot.
* :func:`allocate_used` (hash), :func:`allocate_window` (list), :func:`allocate_seen`
  (string counter), :func:`allocate_plan_lock` (string with a TTL): an allocate step's
  consumed budgets and its re-planning window; :func:`allocate_pending` (hash) and
  :func:`allocate_pending_times` (sorted set): its decisions awaiting consumption feedback.
* :func:`duals` (string): JSON list of an allocate step's dual prices.

Models (``models``):

* :data:`MODELS` (set): every model name.
* :func:`model` (hash): ``next``, ``serving``, ``split``, ``revision``, ``options``,
  ``min_accuracy``, ``v:<N>`` (JSON record of version N).
* :func:`model_blob` (string): a version's artifact bytes.
* :func:`model_recent` (list): recent request samples (.npy bytes, newest first).
* :func:`model_labelled` (string): labelled samples (.npz bytes with x and y).
* :func:`model_shadow` (hash): a shadow experiment's comparison counters of one version.
* :func:`model_history` (list): JSON records of rollbacks and shadow experiments, newest first.
* :data:`MODELS_AT_ZERO` (hash): model name -> JSON ``{since, settled_at, wake_error}`` of a
  model application scaled to zero; :data:`MODEL_WAKE` (hash): model name -> epoch s of the
  latest call that asked it back. A model's hash also holds ``called_at`` (its replicas' last
  call, epoch s), ``zero_downs`` and ``zero_wakes`` (counters).

Multi-cluster (the keeper's own Redis):

* :data:`KEEPER_CLUSTERS` (string): JSON registry of the clusters.
"""

from __future__ import annotations

__all__ = [
    "CANARY_PATTERN",
    "AGGREGATE_PARTS",
    "KEEPER_CLUSTERS",
    "MODELS",
    "MODELS_AT_ZERO",
    "MODEL_WAKE",
    "PIPELINES",
    "PIPELINES_VERSION",
    "PREFIX",
    "SECRETS",
    "SECRETS_VERSION",
    "GATEWAY_ENV",
    "aggregate_keys",
    "allocate_pending",
    "allocate_pending_times",
    "allocate_plan_lock",
    "allocate_seen",
    "allocate_used",
    "allocate_window",
    "canary",
    "canary_figures",
    "canary_pipeline",
    "dedupe_prefix",
    "duals",
    "hash_tag",
    "history",
    "join_prefix",
    "model",
    "model_blob",
    "model_history",
    "model_labelled",
    "model_recent",
    "model_shadow",
    "pipeline_versions",
    "replay",
    "schedule",
    "stats",
]

#: What every EventBus key starts with.
PREFIX = "eventbus:"

# -- control plane ---------------------------------------------------------------------------

#: The control plane's hash tag: its transactions span several of its keys.
_CONTROL = PREFIX + "{control}:"

#: Hash: pipeline name -> JSON record of the deployed pipeline.
PIPELINES = _CONTROL + "pipelines"

#: Counter: incremented with every change of :data:`PIPELINES` (in the same transaction), so a
#: gateway reads every pipeline's record only when one changed, not at each refresh.
PIPELINES_VERSION = _CONTROL + "pipelines-version"


#: Hash: secret name -> JSON ``{"token": <Fernet token>, "updated_at": t}`` of each secret
#: ``eventbus secret set`` stored (the value encrypted, see ``_internal.secret_store``).
SECRETS = _CONTROL + "secrets"

#: Counter: incremented with every change of :data:`SECRETS` (same transaction), so gateways
#: re-read the secrets only when one changed.
SECRETS_VERSION = _CONTROL + "secrets-version"

#: Hash: gateway id -> JSON ``{"at": t, "env": [sha256 hex of each environment variable
#: name]}``: which variables each live gateway has (names hashed, values never), so
#: ``deploy`` can refuse an ``{env: NAME}`` reference no gateway can resolve.
GATEWAY_ENV = _CONTROL + "gateway-env"


#: Hash: pipeline name -> JSON ``{"since": t, "last_event_at": t}`` of each pipeline whose
#: replicas the controller scaled to zero (``serving.replicas.min: 0``).
SCALED_TO_ZERO = _CONTROL + "scaled-to-zero"  # in the deploy transaction

#: Hash: pipeline name -> JSON ``{"reason": text, "since": t}`` of each pipeline that runs
#: DEGRADED: a topic it reads or writes is missing (deleted under it); the controller's topic
#: watch sets and clears it.
DEGRADED = _CONTROL + "degraded"

#: Hash: host name -> JSON ``{"members": {pipeline: {"document", "python_path", "stamp"}}}``
#: of each shared host (``serving.host``): the pipelines its replicas run (``_host``).
HOSTS = _CONTROL + "hosts"

#: Hash: pipeline name -> time (epoch s) a gateway last took a sync call for it: activity that
#: keeps a ``min: 0`` pipeline up, and wakes it when it is at zero.
WAKE = PREFIX + "wake"

#: Hash: parked id (``<replica id>/<source index>``) -> JSON ``{"ends": {"topic[p]": end},
#: "at": t}`` of each idle Kafka source that stopped fetching and waits for its doorbell: the
#: controller rings :func:`doorbell` when a partition's end moves past what the source saw.
PARKED = PREFIX + "parked"


#: Pub/sub channel: a source parked (the ringer, idle while nothing is parked, looks again).
PARKED_NOTICE = PREFIX + "parked-notice"


def doorbell(parked_id: str) -> str:
    """Pub/sub channel: a message wakes the parked Kafka source ``parked_id`` (records came)."""
    return f"{PREFIX}doorbell:{parked_id}"


def join_bridge(group: str) -> str:
    """String with a TTL: ``open`` when the controller woke a pipeline at zero (consumer group
    ``group`` has no live member), then the id of the replica whose source took it and
    consumes the group's partitions by assignment while its group join runs; deleted once
    that source handed over to its group member (see ``serving/_bridge.py``)."""
    return f"{PREFIX}join-bridge:{group}"


def pipeline_versions(name: str) -> str:
    """Hash: version number -> JSON record of every kept version of pipeline ``name``."""
    return f"{_CONTROL}pipeline-versions:{name}"


def canary(pipeline: str) -> str:
    """String: JSON of the pipeline's running canary (YAML, document, schedule, weight)."""
    return f"{_CONTROL}canary:{pipeline}"


#: ``SCAN`` pattern of every :func:`canary` key (not the :func:`canary_figures` ones).
CANARY_PATTERN = _CONTROL + "canary:*"


def canary_pipeline(key: str) -> str:
    """The pipeline name of a :func:`canary` key (as found by :data:`CANARY_PATTERN`)."""
    return key[len(_CONTROL) + len("canary:") :]


def canary_figures(pipeline: str) -> str:
    """Hash: replica id -> JSON of the canary's and the stable version's figures."""
    return f"{_CONTROL}canary-figures:{pipeline}"


# -- observability ---------------------------------------------------------------------------


def stats(pipeline: str) -> str:
    """Hash: entry id (replica, source actor, gateway) -> JSON of its live or final figures."""
    return f"{PREFIX}stats:{{{pipeline}}}"


def history(pipeline: str, bucket: int) -> str:
    """Hash (expires): the figures of the pipeline's history bucket starting at ``bucket``
    (epoch s, a multiple of the bucket length): counters added by every writer, and a
    ``lag:<entry id>``/``up:<entry id>`` field per writer (``observability._history``)."""
    return f"{PREFIX}history:{{{pipeline}}}:{bucket}"


# -- delivery --------------------------------------------------------------------------------


def dedupe_prefix(pipeline: str) -> str:
    """Prefix of the dedupe keys (strings with a TTL, one per delivered output event; the
    suffix is a digest of its ``source`` + ``id``)."""
    return f"{PREFIX}dedupe:{{{pipeline}}}:"


# -- schedules -------------------------------------------------------------------------------


def schedule(pipeline: str, name: str) -> str:
    """Hash: a schedule source's lease (``owner``, ``until``), progress (``through``, epoch ms)
    and counters (``emitted``, ``missed``). One key per script call; tagged by pipeline."""
    return f"{PREFIX}schedule:{{{pipeline}}}:{name}"


# -- gateway -----------------------------------------------------------------------------------


def replay(pipeline: str, signature: str) -> str:
    """String ``1`` with a TTL (the rest of the replay window): a valid HMAC signature of a
    request to ``pipeline`` (hex, as sent), seen once already. No hash tag: each is set
    alone (``SET NX``), so they spread over a cluster's slots."""
    return f"{PREFIX}replay:{pipeline}:{signature}"


# -- step state ------------------------------------------------------------------------------


def join_prefix(pipeline: str, step: str) -> str:
    """Prefix of a join step's state: ``k:<key>`` (hash), ``due`` and ``claim`` (sorted
    sets); the Lua scripts append the suffixes."""
    return f"{PREFIX}join:{{{pipeline}:{step}}}:"


#: The keys of an aggregate step, in the order its Lua scripts declare them as KEYS.
AGGREGATE_PARTS = ("w", "due", "claim", "hll", "hll2", "seen", "closed")


def aggregate_keys(pipeline: str, step: str) -> list[str]:
    """An aggregate step's keys, in :data:`AGGREGATE_PARTS` order, all under the hash tag
    ``{agg:<pipeline>:<step>}``: ``w`` (hash: every open window's fields and the watermark),
    ``due`` (sorted set: window -> close deadline), ``claim`` (sorted set: window being
    emitted -> lease deadline), ``hll``/``hll2`` (scratch HyperLogLog strings), ``seen``
    (sorted set: digest of an applied event -> when it is forgotten; ``delivery.dedupe`` and
    ``exactly_once``), ``closed`` (sorted set, ``exactly_once``: the record of the windows an
    applied event closed -> when it is forgotten)."""
    return [f"{PREFIX}{{agg:{pipeline}:{step}}}:{part}" for part in AGGREGATE_PARTS]


def _allocate(pipeline: str, step: str, what: str) -> str:
    return f"{PREFIX}allocate:{{{pipeline}:{step}}}:{what}"


def allocate_used(pipeline: str, step: str) -> str:
    """Hash: resource index -> amount an allocate step has consumed of its budget."""
    return _allocate(pipeline, step, "used")


def allocate_window(pipeline: str, step: str) -> str:
    """List: an allocate step's recent requests (JSON), the window it re-plans from."""
    return _allocate(pipeline, step, "window")


def allocate_seen(pipeline: str, step: str) -> str:
    """String (counter): requests an allocate step has seen."""
    return _allocate(pipeline, step, "seen")


def allocate_plan_lock(pipeline: str, step: str) -> str:
    """String with a TTL: held by the replica re-planning an allocate step."""
    return _allocate(pipeline, step, "plan-lock")


def allocate_pending(pipeline: str, step: str) -> str:
    """Hash: decision (request id) -> JSON record, an allocate step's decisions awaiting feedback."""
    return _allocate(pipeline, step, "pending")


def allocate_pending_times(pipeline: str, step: str) -> str:
    """Sorted set: decision -> when it was made (epoch s), for settling those with no feedback."""
    return _allocate(pipeline, step, "pending-times")


def duals(pipeline: str, step: str) -> str:
    """String: JSON list of an allocate step's dual prices (λ)."""
    return f"{PREFIX}duals:{{{pipeline}:{step}}}"


# -- models ----------------------------------------------------------------------------------

#: Set: every model name in the registry.
MODELS = PREFIX + "models"
#: Hash: each model pool's settings as last deployed (pool name -> JSON).
MODEL_POOLS = PREFIX + "model-pools"
#: Hash: model applications scaled to zero (model name -> JSON ``{since, ...}``).
MODELS_AT_ZERO = PREFIX + "models-at-zero"
#: Hash: model name -> epoch s of the latest call that found it at zero and asked it back.
MODEL_WAKE = PREFIX + "model-wake"


def model(name: str) -> str:
    """Hash: a model's version counter, serving version, split, revision, options and
    version records (``v:<N>``)."""
    return f"{MODELS}:{{{name}}}"


def model_blob(name: str, version: int) -> str:
    """String: the artifact bytes of a model version."""
    return f"{model(name)}:blob:{version}"


def model_recent(name: str) -> str:
    """List: recent request samples of a model (.npy bytes, newest first)."""
    return f"{model(name)}:recent"


def model_labelled(name: str) -> str:
    """String: a model's labelled samples (.npz bytes with x and y)."""
    return f"{model(name)}:labelled"


def model_shadow(name: str, version: int) -> str:
    """Hash: comparison counters of a shadow experiment of ``version`` against the served one."""
    return f"{model(name)}:shadow:{version}"


def model_history(name: str) -> str:
    """List: JSON records of a model's rollbacks and shadow experiments, newest first."""
    return f"{model(name)}:history"


# -- multi-cluster ---------------------------------------------------------------------------

#: String: JSON registry of the clusters (in the keeper's Redis).
KEEPER_CLUSTERS = PREFIX + "keeper:clusters"


def hash_tag(key: str) -> str:
    """The part of ``key`` Redis Cluster hashes to pick its slot (its first ``{...}``, or the
    whole key when it has none), as the cluster specification defines it."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key
