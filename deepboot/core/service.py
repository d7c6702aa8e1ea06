"""An inference service: what the simulator's tasks and the runtime's replicas serve.

One :class:`ServiceSpec` per service. The simulator builds one per service of its
workload (only ``name``, ``model`` and ``cold_start_s`` matter there); the runtime
reads one from a TOML file (:mod:`deepboot.runtime.servicespec`). The control loop
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

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
"""A service name: used in URLs and Ray actor names."""

MAX_CONCURRENCY = 1024
MAX_REPLICAS = 4096
MAX_QUEUE_BOUND = 100_000
MAX_REQUEST_TIMEOUT_S = 86_400.0

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
)
"""Every field, in declaration order (the keys of :meth:`ServiceSpec.to_json`)."""


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
        cold_start_s: Start-up seconds of a new replica (finite, >= 0); None = measured
            on the first start (runtime).
        queue_bound: Runtime: most requests waiting for a replica (then 503), in
            [1, 100000].
        request_timeout_s: Runtime: most seconds a request waits in the queue (then
            503), in (0, 86400].

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

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_RE.match(self.name):
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
            if cold < 0.0:
                raise ConfigError(
                    f"service {self.name!r} field 'cold_start_s': must be >= 0 seconds, "
                    f"got {cold!r}"
                )
        timeout = self._number("request_timeout_s")
        if not 0.0 < timeout <= MAX_REQUEST_TIMEOUT_S:
            raise ConfigError(
                f"service {self.name!r} field 'request_timeout_s': must be in "
                f"(0, {MAX_REQUEST_TIMEOUT_S:g}] seconds, got {timeout!r}"
            )

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
