"""An inference service: what the simulator's tasks and the runtime's replicas serve.

One :class:`ServiceSpec` per service. The simulator builds one per service of its
workload (only ``name``, ``model`` and ``cold_start_s`` matter there); the runtime
reads one from a TOML file (:mod:`deepboot.runtime.client.servicespec`). The control loop
reads ``max_replicas``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from deepboot.core.errors import ConfigError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
"""A service name: used in URLs and Ray actor names. Match it whole
(:func:`valid_name`): ``$`` would accept a trailing newline."""

MAX_CONCURRENCY = 1024
MAX_REPLICAS = 4096
MAX_QUEUE_BOUND = 100_000
MAX_REQUEST_TIMEOUT_S = 86_400.0
MAX_COLD_START_S = 86_400.0
"""Longest cold start accepted (a day: longer is a typo, and overflows a summary)."""
MAX_MODEL_GB = 100_000.0
"""Largest model accepted, GB (a typo beyond: the largest models are a few TB)."""
MAX_BODY_BYTES = 67_108_864  # 64 MiB
DEFAULT_BODY_BYTES = 1_048_576  # 1 MiB
DEFAULT_SLO_WAIT_S = 1.0
"""A request's default SLO: handed to a ready replica within a second ..."""
DEFAULT_SLO_TARGET = 0.99
"""... for 99% of the service's requests."""
DEFAULT_LOAD_TIMEOUT_S = 300.0
"""A replica's load timeout before any cold start of its service was measured."""
LOAD_TIMEOUT_FACTOR = 3.0
"""Once one was measured: this many times the measured cold start ..."""
MIN_LOAD_TIMEOUT_S = 10.0
"""... but never less, so that a loaded machine's slower start is not taken for a hang."""

FIELDS = (
    "name",
    "model",
    "handler",
    "args",
    "concurrency",
    "max_replicas",
    "cold_start_s",
    "queue_bound",
    "request_timeout_s",
    "load_timeout_s",
    "handler_timeout_s",
    "max_body_bytes",
    "slo_wait_s",
    "slo_target",
    "guaranteed_replicas",
    "model_gb",
)
"""Every field, in declaration order (the keys of :meth:`ServiceSpec.to_json`)."""


def valid_name(name: object) -> bool:
    """True when ``name`` is a whole service or job name (see :data:`NAME_RE`)."""
    return isinstance(name, str) and NAME_RE.fullmatch(name) is not None


def _no_args() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """One inference service.

    Attributes:
        name: Service id (letters, digits, ``_.-``; starts with a letter or digit; at
            most 63 characters): used in URLs and Ray actor names.
        model: Model name (simulator: its catalog key; runtime: a label).
        handler: Runtime: ``"ABSOLUTE/path/file.py:factory"`` or
            ``"package.module:factory"``; empty in the simulator.
        args: Keyword arguments of the factory (read-only).
        concurrency: Requests in flight per replica, in [1, 1024].
        max_replicas: Most replicas loaded at once; 0 = no cap; in [0, 4096].
        cold_start_s: Start-up seconds of a new replica, in [0, 86400]; None =
            measured on the first start (runtime).
        queue_bound: Runtime: most requests waiting for a replica (then 503), in
            [1, 100000].
        request_timeout_s: Runtime: most seconds a request waits in the queue (then
            503), in (0, 86400].
        load_timeout_s: Runtime: most seconds a replica may take to load its handler
            (then it is killed and its GPU freed), in (0, 86400]; None = 3x the
            measured cold start (at least 10 s) once one is known, 300 s before that
            (:meth:`load_timeout`).
        handler_timeout_s: Runtime: most seconds one call of the handler may run (then
            504, and the replica is restarted), in (0, 86400]; None =
            ``request_timeout_s``. A request spends at most ``request_timeout_s +
            handler_timeout_s`` in the system, whatever retries happen.
        max_body_bytes: Runtime: largest request body accepted (then 413), in
            [1, 64 MiB]; 1 MiB by default.
        slo_wait_s: The request SLO: most seconds a request may wait before a ready
            replica takes it (queueing, cold start and reclaim included: the
            simulator's ``delay``), in (0, 86400]; 1 s by default. Below the cold
            start only a replica already warm meets it (see docs/slo.md).
        slo_target: Fraction of the service's requests that must meet
            ``slo_wait_s``, in (0, 1); 0.99 by default.
        guaranteed_replicas: Replicas of the service held warm and never lent
            (Kueue's ``lendingLimit`` for serving), in [0, 4096] and at most
            ``max_replicas`` when that caps; 0 by default.
        model_gb: Size of the model's weights, GB, in (0, 100000]: what a replica
            copies from a node's host-memory cache instead of a cold start
            (:mod:`deepboot.world.hostcache`); None = the simulator's catalog size
            for the model, if any.

    Raises:
        ConfigError: a field is out of range or of the wrong type; the message names it.
    """

    name: str
    model: str
    handler: str = ""
    args: Mapping[str, Any] = field(default_factory=_no_args)
    concurrency: int = 1
    max_replicas: int = 0
    cold_start_s: float | None = None
    queue_bound: int = 64
    request_timeout_s: float = 60.0
    load_timeout_s: float | None = None
    handler_timeout_s: float | None = None
    max_body_bytes: int = DEFAULT_BODY_BYTES
    slo_wait_s: float = DEFAULT_SLO_WAIT_S
    slo_target: float = DEFAULT_SLO_TARGET
    guaranteed_replicas: int = 0
    model_gb: float | None = None

    def __post_init__(self) -> None:
        if not valid_name(self.name):
            raise ConfigError(
                f"service field 'name': {self.name!r}: use letters, digits and _.-, "
                "starting with a letter or digit (at most 63 characters)"
            )
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError(f"service {self.name!r} field 'model': must be a non-empty string")
        if not isinstance(self.handler, str):
            raise ConfigError(f"service {self.name!r} field 'handler': must be a string")
        if not isinstance(self.args, Mapping):
            raise ConfigError(f"service {self.name!r} field 'args': must be a mapping")
        if not all(isinstance(k, str) for k in self.args):
            raise ConfigError(f"service {self.name!r} field 'args': keys must be strings")
        if not isinstance(self.args, MappingProxyType):
            object.__setattr__(self, "args", MappingProxyType(dict(self.args)))
        self._int("concurrency", 1, MAX_CONCURRENCY)
        self._int("max_replicas", 0, MAX_REPLICAS)
        self._int("queue_bound", 1, MAX_QUEUE_BOUND)
        if self.cold_start_s is not None:
            cold = self._number("cold_start_s")
            if not 0.0 <= cold <= MAX_COLD_START_S:
                raise ConfigError(
                    f"service {self.name!r} field 'cold_start_s': must be in "
                    f"[0, {MAX_COLD_START_S:g}] seconds, got {cold!r}"
                )
        if self.model_gb is not None:
            gb = self._number("model_gb")
            if not 0.0 < gb <= MAX_MODEL_GB:
                raise ConfigError(
                    f"service {self.name!r} field 'model_gb': must be in "
                    f"(0, {MAX_MODEL_GB:g}] GB, got {gb!r}"
                )
        self._int("max_body_bytes", 1, MAX_BODY_BYTES)
        self._int("guaranteed_replicas", 0, MAX_REPLICAS)
        if 0 < self.max_replicas < self.guaranteed_replicas:
            raise ConfigError(
                f"service {self.name!r} field 'guaranteed_replicas': "
                f"{self.guaranteed_replicas} is more than max_replicas = {self.max_replicas}"
            )
        target = self._number("slo_target")
        if not 0.0 < target < 1.0:
            raise ConfigError(
                f"service {self.name!r} field 'slo_target': must be in (0, 1) "
                f"(a fraction of requests), got {target!r}"
            )
        for key in ("request_timeout_s", "load_timeout_s", "handler_timeout_s", "slo_wait_s"):
            if getattr(self, key) is None and key in ("load_timeout_s", "handler_timeout_s"):
                continue
            timeout = self._number(key)
            if not 0.0 < timeout <= MAX_REQUEST_TIMEOUT_S:
                raise ConfigError(
                    f"service {self.name!r} field {key!r}: must be in "
                    f"(0, {MAX_REQUEST_TIMEOUT_S:g}] seconds, got {timeout!r}"
                )

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        # ``args`` is a read-only mappingproxy, which pickle refuses: rebuild from
        # plain JSON values (a workload's specs travel to worker processes).
        return (_from_json, (self.to_json(),))

    @property
    def handler_deadline_s(self) -> float:
        """Most seconds one call of the handler may run."""
        return self.request_timeout_s if self.handler_timeout_s is None else self.handler_timeout_s

    def load_timeout(self, measured_cold_start_s: float | None) -> float:
        """Most seconds a replica may take to load: ``load_timeout_s`` when set, else
        3x the measured cold start once one is known (never below 10 s), else 300 s."""
        if self.load_timeout_s is not None:
            return self.load_timeout_s
        cold = self.cold_start_s if measured_cold_start_s is None else measured_cold_start_s
        if cold is None:
            return DEFAULT_LOAD_TIMEOUT_S
        return max(LOAD_TIMEOUT_FACTOR * cold, MIN_LOAD_TIMEOUT_S)

    def _int(self, key: str, lo: int, hi: int) -> None:
        value = getattr(self, key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(
                f"service {self.name!r} field {key!r}: must be an integer, got {value!r}"
            )
        if not lo <= value <= hi:
            raise ConfigError(
                f"service {self.name!r} field {key!r}: must be in [{lo}, {hi}], got {value}"
            )

    def _number(self, key: str) -> float:
        value = getattr(self, key)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ConfigError(
                f"service {self.name!r} field {key!r}: must be a finite number, got {value!r}"
            )
        return float(value)

    def to_json(self) -> dict[str, Any]:
        """The spec as plain JSON values (``args`` as a plain dict)."""
        return {
            "name": self.name,
            "model": self.model,
            "handler": self.handler,
            "args": dict(self.args),
            "concurrency": self.concurrency,
            "max_replicas": self.max_replicas,
            "cold_start_s": self.cold_start_s,
            "queue_bound": self.queue_bound,
            "request_timeout_s": self.request_timeout_s,
            "load_timeout_s": self.load_timeout_s,
            "handler_timeout_s": self.handler_timeout_s,
            "max_body_bytes": self.max_body_bytes,
            "slo_wait_s": self.slo_wait_s,
            "slo_target": self.slo_target,
            "guaranteed_replicas": self.guaranteed_replicas,
            "model_gb": self.model_gb,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServiceSpec:
        """The spec :meth:`to_json` wrote (missing optional keys take their defaults).

        Raises:
            ConfigError: an unknown or missing key, or a bad value.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"service: expected a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise ConfigError(f"service field {unknown[0]!r}: unknown (known: {', '.join(FIELDS)})")
        for key in ("name", "model"):
            if key not in data:
                raise ConfigError(f"service field {key!r}: missing (required)")
        return cls(**dict(data))


def _from_json(data: dict[str, Any]) -> ServiceSpec:
    """Unpickle a :class:`ServiceSpec` (see ``ServiceSpec.__reduce__``)."""
    return ServiceSpec.from_json(data)
