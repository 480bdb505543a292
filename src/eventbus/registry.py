"""The component registries: step, source and sink kinds by name.

A kind is one module that registers its name, its config (a pydantic model or any type
pydantic can validate) and its factory together, as Redpanda Connect/Benthos plugins register
a spec with its constructor::

    from eventbus.registry import steps

    @steps.register("upper", config=UpperConfig, description="Upper-case data fields.")
    def build_upper(step_id: str, config: UpperConfig, context: StepContext) -> Step:
        return UpperStep(step_id, config)

Built-in kinds are registered lazily by module path, so ``import eventbus`` stays cheap; a
registry imports them the first time it is asked about its kinds. Third-party packages add
kinds through the entry-point groups ``eventbus.steps``, ``eventbus.sources`` and
``eventbus.sinks``: each entry point names a module (or ``module:attr``) whose import registers
the kind; the entry point's name must be the kind's name. A plugin that fails to import, or that
registers a name already taken, is recorded (``eventbus plugins`` shows it) and reported when a
pipeline names its kind, never a crash at deploy.

This module imports nothing else of EventBus but :mod:`eventbus.errors`: every layer may use it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from eventbus.errors import UnknownComponentError

__all__ = [
    "PluginProblem",
    "Registration",
    "Registry",
    "all_registries",
    "sinks",
    "sources",
    "steps",
]

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Registration(Generic[_F]):
    """One registered kind.

    Attributes:
        name: the YAML key of the kind (``filter``, ``kafka``, ...).
        config: what the key's value is validated as (a pydantic model, or an annotation such
            as ``str | FilterDialect``).
        factory: builds the runtime component from its config (see each registry's contract).
        description: one line for the JSON Schema and ``eventbus plugins``.
        origin: where it came from: ``builtin`` or the distribution name of its plugin.
        module: the module that registered it.
        traits: the kind's optional hooks and flags, read by the parts that need them (e.g.
            a step's ``pure`` or ``expressions``, a source's ``ingress``).
    """

    name: str
    config: Any
    factory: _F
    description: str
    origin: str
    module: str
    traits: dict[str, Any] = field(default_factory=dict)

    def trait(self, name: str, default: Any = None) -> Any:
        """A trait of the kind, or ``default`` when it declares none."""
        return self.traits.get(name, default)


@dataclass(frozen=True)
class PluginProblem:
    """A plugin entry point that could not be used.

    Attributes:
        group: the entry-point group (``eventbus.steps``...).
        name: the entry point's name (the kind it should register).
        distribution: the installed package that declares it.
        error: what went wrong, with the fix.
    """

    group: str
    name: str
    distribution: str
    error: str


class Registry(Generic[_F]):
    """Kinds of one component family, by name.

    Registries are objects: the module-level ones (:data:`steps`, :data:`sources`,
    :data:`sinks`) are the defaults, tests may build their own.

    Args:
        family: ``step``, ``source`` or ``sink`` (for messages).
        entry_point_group: the group third-party packages register under (None: none).
        builtins: kind name -> module that registers it, imported on first use, in this order.
    """

    def __init__(
        self, family: str, entry_point_group: str | None, builtins: dict[str, str] | None = None
    ) -> None:
        self.family = family
        self.entry_point_group = entry_point_group
        self._builtins = dict(builtins or {})
        self._kinds: dict[str, Registration[_F]] = {}
        self._problems: list[PluginProblem] = []
        self._loaded = False
        self._loader: int | None = None
        self._lock = threading.RLock()

    # -- registering --------------------------------------------------------------------------
    def register(
        self, name: str, *, config: Any, description: str = "", **traits: Any
    ) -> Callable[[_F], _F]:
        """Register ``name`` with its config and (decorated) factory.

        Raises:
            ValueError: the name is not snake_case or is taken (by a built-in or a plugin).
        """

        def decorate(factory: _F) -> _F:
            self.add(
                Registration(
                    name=name,
                    config=config,
                    factory=factory,
                    description=description or (factory.__doc__ or "").strip().split("\n")[0],
                    origin=_origin(getattr(factory, "__module__", "?")),
                    module=getattr(factory, "__module__", "?"),
                    traits=traits,
                )
            )
            return factory

        return decorate

    def add(self, registration: Registration[_F]) -> None:
        """Add a registration (see :meth:`register`)."""
        name = registration.name
        if not name.isidentifier() or name != name.lower() or name.startswith("_"):
            msg = f"{self.family} kind name {name!r} must be snake_case (e.g. 'my_{self.family}')"
            raise ValueError(msg)
        with self._lock:
            taken = self._kinds.get(name)
            if (
                taken is not None
                and taken.origin != "builtin"
                and registration.origin == "builtin"
                and name in self._builtins
            ):  # a plugin imported before the built-ins loaded took a built-in's name
                self._problems.append(
                    PluginProblem(
                        self.entry_point_group or "",
                        name,
                        taken.origin,
                        f"{self.family} kind {name!r} is a built-in kind; rename the plugin's kind",
                    )
                )
                taken = None
            if taken is not None and taken.module != registration.module:
                msg = (
                    f"{self.family} kind {name!r} is already registered by {taken.origin} "
                    f"({taken.module}); give the kind of {registration.module} another name"
                )
                raise ValueError(msg)
            self._kinds[name] = registration

    # -- looking up ---------------------------------------------------------------------------
    def get(self, name: str) -> Registration[_F]:
        """The kind called ``name``.

        Raises:
            UnknownComponentError: no such kind (with the closest name, or the plugin that
                should have provided it and why it did not).
        """
        self.load()
        found = self._kinds.get(name)
        if found is not None:
            return found
        for problem in self._problems:
            if problem.name == name:
                msg = (
                    f"{self.family} kind {name!r} comes from plugin {problem.distribution!r}, "
                    f"which could not be loaded: {problem.error}"
                )
                raise UnknownComponentError(msg)
        close = difflib.get_close_matches(name, list(self._kinds), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        msg = f"unknown {self.family} kind {name!r}{hint}; known: {', '.join(self._kinds)}"
        raise UnknownComponentError(msg)

    def names(self) -> list[str]:
        """Every kind's name: built-ins in their order, then plugins by name."""
        self.load()
        return list(self._kinds)

    def __iter__(self) -> Iterator[Registration[_F]]:
        self.load()
        return iter(list(self._kinds.values()))

    def __contains__(self, name: object) -> bool:
        self.load()
        return name in self._kinds

    def problems(self) -> list[PluginProblem]:
        """Plugins of this family that could not be loaded."""
        self.load()
        return list(self._problems)

    # -- loading ------------------------------------------------------------------------------
    def load(self) -> None:
        """Import the built-in kinds, then the plugins' entry points (once; other threads
        asking meanwhile wait for it to finish)."""
        if self._loaded or self._loader == threading.get_ident():
            return  # loaded, or a kind module being imported asks (re-entrant)
        with self._lock:
            if self._loaded:
                return
            self._loader = threading.get_ident()
            try:
                for module in self._builtins.values():
                    importlib.import_module(module)
                missing = [n for n in self._builtins if n not in self._kinds]
                if missing:
                    msg = f"built-in {self.family} kinds {missing} did not register"
                    raise RuntimeError(msg)
                self._load_entry_points()
                builtin = list(self._builtins)
                plugins = sorted(n for n in self._kinds if n not in self._builtins)
                self._kinds = {n: self._kinds[n] for n in builtin + plugins}
                self._loaded = True
            finally:
                self._loader = None

    def _load_entry_points(self) -> None:
        if self.entry_point_group is None:
            return
        group = self.entry_point_group
        for ep in importlib.metadata.entry_points(group=group):
            dist = ep.dist.name if ep.dist is not None else "?"
            package = ep.value.split(":")[0].split(".")[0]
            try:
                loaded = ep.load()
                if isinstance(loaded, Registration):
                    self.add(loaded)
            except Exception as exc:  # noqa: BLE001 - a broken plugin is reported, not fatal
                error = _fix(ep.value, exc)
                self._problems.append(PluginProblem(group, ep.name, dist, error))
                continue
            found = self._kinds.get(ep.name)
            if found is None:
                error = (
                    f"entry point {ep.name} = {ep.value!r} registered no {self.family} kind "
                    f"named {ep.name!r}; register one with eventbus.registry.{self.family}s.register"
                )
                self._problems.append(PluginProblem(group, ep.name, dist, error))
                continue
            if found.module.split(".")[0] != package:
                error = (
                    f"{self.family} kind {ep.name!r} is already registered by {found.origin} "
                    f"({found.module}); rename the plugin's kind"
                )
                self._problems.append(PluginProblem(group, ep.name, dist, error))
                continue
            self._kinds[ep.name] = replace(found, origin=dist)


def _origin(module: str) -> str:
    return "builtin" if module.split(".")[0] == "eventbus" else module.split(".")[0]


def _fix(target: str, exc: BaseException) -> str:
    module = target.split(":")[0]
    error = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ModuleNotFoundError) and exc.name and module.startswith(exc.name):
        return f"importing {target!r} failed: {error}; is the plugin's package installed in this environment?"
    return f"importing {target!r} failed: {error}; fix the plugin or uninstall it"


#: Step kinds (``eventbus.pipelines.Step`` factories).
steps: Registry[Callable[..., Any]] = Registry(
    "step",
    "eventbus.steps",
    {
        "filter": "eventbus.pipelines.steps._filter",
        "convert": "eventbus.pipelines.steps._convert",
        "function": "eventbus.pipelines.steps._function",
        "join": "eventbus.pipelines.steps._join",
        "aggregate": "eventbus.pipelines.steps._aggregate",
        "allocate": "eventbus.pipelines.steps._allocate",
        "model": "eventbus.pipelines.steps._model",
        "ensemble": "eventbus.pipelines.steps._model",
        "enrich": "eventbus.pipelines.steps._enrich",
    },
)

#: Source kinds (see ``eventbus.eventing.Source``).
sources: Registry[Callable[..., Any]] = Registry(
    "source",
    "eventbus.sources",
    {
        "kafka": "eventbus.eventing.sources._kafka",
        "http": "eventbus.eventing.sources._http_config",
        "grpc": "eventbus.eventing.sources._http_config",
        "schedule": "eventbus.eventing.sources._schedule_config",
        "pipeline": "eventbus.eventing.sinks._pipeline",
    },
)

#: Sink kinds (see ``eventbus.eventing.Sink``).
sinks: Registry[Callable[..., Any]] = Registry(
    "sink",
    "eventbus.sinks",
    {
        "kafka": "eventbus.eventing.sinks._kafka",
        "http": "eventbus.eventing.sinks._http",
        "pipeline": "eventbus.eventing.sinks._pipeline",
    },
)


def all_registries() -> dict[str, Registry[Callable[..., Any]]]:
    """The default registries by family."""
    return {"step": steps, "source": sources, "sink": sinks}
