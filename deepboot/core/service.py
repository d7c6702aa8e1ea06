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
MAX_GPUS_PER_REPLICA = 64
"""Most GPUs one replica may span (all on one node)."""
MAX_STOP_GRACE_S = 600.0
DEFAULT_STOP_GRACE_S = 10.0
MAX_COMMAND_WORDS = 1024
MAX_WORD_BYTES = 4096
MAX_PATH_CHARS = 2048
"""Longest ``ready_path``, ``health_path`` or sleep/wake path."""
RESERVED_NAMES = frozenset({"jobs", "services", "dashboard"})
"""Names no service may take: ``/v1/<service>/...`` would shadow the endpoint's own routes."""
PLACEHOLDERS = ("{port}", "{gpus}", "{model}")
"""What a command service's words may name, filled in when its replica starts."""
HTTP_METHODS = frozenset({"GET", "POST", "PUT"})
"""Methods a sleep or wake call may use."""
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
    "command",
    "workdir",
    "env",
    "ready_path",
    "health_path",
    "sleep",
    "wake",
    "sleep_gpu_gb",
    "stop_grace_s",
    "gpus_per_replica",
)
"""Every field, in declaration order (the keys of :meth:`ServiceSpec.to_json`)."""


def valid_name(name: object) -> bool:
    """True when ``name`` is a whole service or job name (see :data:`NAME_RE`)."""
    return isinstance(name, str) and NAME_RE.fullmatch(name) is not None


def _no_args() -> Mapping[str, Any]:
    return MappingProxyType({})


def _check_path(where: str, value: object) -> str:
    """An HTTP path of the server's: starts with ``/``, printable ASCII without
    spaces, bounded (a query string allowed: vLLM's ``/sleep?level=1``)."""
    if (
        not isinstance(value, str)
        or not value.startswith("/")
        or value.startswith("//")
        or len(value) > MAX_PATH_CHARS
        or not all("!" <= c <= "~" for c in value)
    ):
        raise ConfigError(
            f"{where}: must be a path starting with '/' (printable ASCII, no spaces, "
            f"at most {MAX_PATH_CHARS} characters), got {value!r}"
        )
    return value


@dataclass(frozen=True, slots=True)
class HttpCall:
    """One call deepboot makes to a command service's server (its sleep or its wake).

    Attributes:
        method: ``GET``, ``POST`` or ``PUT``.
        path: The path (a query allowed), e.g. vLLM's ``/sleep?level=1``.
        timeout_s: Most seconds the server may take to answer 2xx, in (0, 3600]; then
            the call failed (a sleep falls back to evicting, a wake to a cold start).
    """

    method: str
    path: str
    timeout_s: float = 30.0

    @classmethod
    def parse(cls, where: str, value: object) -> HttpCall:
        """From a TOML or JSON table ``{method, path, timeout_s}`` (or an HttpCall).

        Raises:
            ConfigError: naming ``where`` and the sub-key at fault.
        """
        if isinstance(value, HttpCall):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(
                f'{where}: must be a table like {{ method = "POST", path = "/sleep", '
                f"timeout_s = 30 }}, got {value!r}"
            )
        unknown = sorted(set(value) - {"method", "path", "timeout_s"})
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: unknown (known: method, path, timeout_s)")
        method = value.get("method", "POST")
        if not isinstance(method, str) or method.upper() not in HTTP_METHODS:
            raise ConfigError(
                f"{where}.method: one of {', '.join(sorted(HTTP_METHODS))}, got {method!r}"
            )
        if "path" not in value:
            raise ConfigError(f"{where}.path: missing (required)")
        path = _check_path(f"{where}.path", value["path"])
        timeout = value.get("timeout_s", 30.0)
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < float(timeout) <= 3600
        ):
            raise ConfigError(f"{where}.timeout_s: must be in (0, 3600] seconds, got {timeout!r}")
        return cls(method.upper(), path, float(timeout))

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "path": self.path, "timeout_s": self.timeout_s}


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
        command: Runtime: a command service's server, as an argv (instead of
            ``handler``); its words may name ``{port}`` (the port deepboot chose,
            on loopback), ``{gpus}`` (the replica's GPUs as CUDA devices,
            comma-separated: also its ``CUDA_VISIBLE_DEVICES``) and ``{model}``.
            ``python`` means the replica's interpreter. Empty for a handler service.
        workdir: The command's working directory (the service file's directory).
        env: Extra environment variables of the command (read-only).
        ready_path: The server's path polled until it answers 200 (within the load
            timeout) before its replica takes requests; ``/health`` by default.
        health_path: A path polled while the replica serves (every
            few seconds); failing three times in a row ends the replica. Empty: none.
        sleep: The call that makes the server free its GPU memory and keep its weights
            in host memory (vLLM's ``POST /sleep?level=1``); deepboot makes it when
            the replica's GPUs are lent and keeps the process. None: evicted instead.
        wake: The call that brings the weights back (vLLM's ``POST /wake_up``); both
            or neither of ``sleep`` and ``wake``.
        sleep_gpu_gb: GPU memory a sleeping server still holds on each of its GPUs
            (a CUDA context, the allocator's pool), in [0, 100000]: what a training
            worker lent that GPU cannot use.
        stop_grace_s: Seconds the server may take to exit after SIGTERM (then
            SIGKILL), in [0, 600].
        gpus_per_replica: GPUs one replica spans, all on one node, in [1, 64]
            (a tensor-parallel server).

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
    command: tuple[str, ...] = ()
    workdir: str = ""
    env: Mapping[str, str] = field(default_factory=_no_args)
    ready_path: str = "/health"
    health_path: str = ""
    sleep: HttpCall | None = None
    wake: HttpCall | None = None
    sleep_gpu_gb: float = 0.0
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    gpus_per_replica: int = 1

    def __post_init__(self) -> None:
        if not valid_name(self.name):
            raise ConfigError(
                f"service field 'name': {self.name!r}: use letters, digits and _.-, "
                "starting with a letter or digit (at most 63 characters)"
            )
        if self.name in RESERVED_NAMES:
            raise ConfigError(
                f"service field 'name': {self.name!r} is reserved (/v1/{self.name} is the "
                "endpoint's own route); choose another name"
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
        self._check_command()
        self._int("gpus_per_replica", 1, MAX_GPUS_PER_REPLICA)
        sleep_gb = self._number("sleep_gpu_gb")
        if not 0.0 <= sleep_gb <= MAX_MODEL_GB:
            raise ConfigError(
                f"service {self.name!r} field 'sleep_gpu_gb': must be in "
                f"[0, {MAX_MODEL_GB:g}] GB, got {sleep_gb!r}"
            )
        grace = self._number("stop_grace_s")
        if not 0.0 <= grace <= MAX_STOP_GRACE_S:
            raise ConfigError(
                f"service {self.name!r} field 'stop_grace_s': must be in "
                f"[0, {MAX_STOP_GRACE_S:g}] seconds, got {grace!r}"
            )
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

    def _check_command(self) -> None:
        """``command``, ``env``, the paths and the sleep/wake pair (see the class doc)."""
        who = f"service {self.name!r} field"
        if isinstance(self.command, str) or not isinstance(self.command, tuple | list):
            raise ConfigError(f"{who} 'command': must be a list of strings, e.g. "
                              '["python", "server.py", "--port", "{port}"]')  # fmt: skip
        if len(self.command) > MAX_COMMAND_WORDS:
            raise ConfigError(f"{who} 'command': at most {MAX_COMMAND_WORDS} words")
        for i, word in enumerate(self.command):
            if (
                not isinstance(word, str)
                or "\x00" in word
                or len(word.encode("utf-8", "surrogatepass")) > MAX_WORD_BYTES
            ):
                raise ConfigError(
                    f"{who} 'command': word {i} must be a string without NUL bytes, "
                    f"at most {MAX_WORD_BYTES} bytes, got {word!r}"
                )
        if self.command and not self.command[0].strip():
            raise ConfigError(f"{who} 'command': the program (word 0) must not be empty")
        if not isinstance(self.command, tuple):
            object.__setattr__(self, "command", tuple(self.command))
        if self.command and self.handler:
            raise ConfigError(f"{who} 'command': give either handler or command, not both")
        if not isinstance(self.workdir, str):
            raise ConfigError(f"{who} 'workdir': must be a string")
        if not isinstance(self.env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\x00" not in k + v
            for k, v in self.env.items()
        ):
            raise ConfigError(
                f"{who} 'env': must be a table of strings (names without '=' or NUL bytes)"
            )
        if not isinstance(self.env, MappingProxyType):
            object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        _check_path(f"{who} 'ready_path'", self.ready_path)
        if self.health_path:
            _check_path(f"{who} 'health_path'", self.health_path)
        for key in ("sleep", "wake"):
            value = getattr(self, key)
            if value is not None:
                object.__setattr__(self, key, HttpCall.parse(f"{who} '{key}'", value))
        if (self.sleep is None) != (self.wake is None):
            raise ConfigError(f"{who} 'sleep': give both sleep and wake, or neither")
        if self.sleep is not None and not self.command:
            raise ConfigError(f"{who} 'sleep': only a command service (command = [...]) sleeps")

    @property
    def is_command(self) -> bool:
        """A command service: deepboot runs its own HTTP server and proxies to it."""
        return bool(self.command)

    def argv(self, port: int, gpus: str) -> list[str]:
        """The command with its placeholders filled in (``gpus``: "0,1")."""
        fill = {"{port}": str(port), "{gpus}": gpus, "{model}": self.model}
        out = []
        for word in self.command:
            for key, value in fill.items():
                word = word.replace(key, value)
            out.append(word)
        return out

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
            "command": list(self.command),
            "workdir": self.workdir,
            "env": dict(self.env),
            "ready_path": self.ready_path,
            "health_path": self.health_path,
            "sleep": None if self.sleep is None else self.sleep.to_json(),
            "wake": None if self.wake is None else self.wake.to_json(),
            "sleep_gpu_gb": self.sleep_gpu_gb,
            "stop_grace_s": self.stop_grace_s,
            "gpus_per_replica": self.gpus_per_replica,
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
