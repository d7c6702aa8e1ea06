"""A services file as the simulator reads it (``--services FILE``, ``services=``).

The file is the one services format (:mod:`deepboot.core.servicefile`). With it, a
workload's inference rows name its services (``application = "infer-<name>"``, the
whole rest after ``infer-``), a service's model is a label, and each service's spec
gives the simulator its cold start (``cold_start_s``, required for every service a
workload uses), its ``concurrency`` (tasks one replica serves at once) and its
``max_replicas``. Without it, services are the DeepBoot ``infer-<model>-<k>`` rows
with per-model cold starts (:class:`~deepboot.sim.config.SimConfig`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from deepboot.core.errors import InputError
from deepboot.core.jobs import Workload
from deepboot.core.service import ServiceSpec
from deepboot.core.servicefile import header_lines, parse_services, read_document

INFER_PREFIX = "infer-"
"""What an inference row's ``application`` starts with; the service's name follows."""


@dataclass(frozen=True, slots=True)
class ServicesFile:
    """A services file's services, by name, and where each is written.

    Attributes:
        path: The file, as given (errors name it).
        specs: Service name -> spec, in file order (read-only).
        lines: Service name -> the line of its ``[[service]]`` header (read-only).
    """

    path: str
    specs: Mapping[str, ServiceSpec]
    lines: Mapping[str, int]

    def known(self) -> str:
        """The services' names for a message (the first 10)."""
        names = list(self.specs)
        more = f" and {len(names) - 10} more" if len(names) > 10 else ""
        return "its services: " + ", ".join(names[:10]) + more

    def for_simulation(self, name: str, used_at: str) -> ServiceSpec:
        """Service ``name``'s spec, checked for the simulator: it has a cold start.

        Args:
            name: A service of the file.
            used_at: Where the workload uses it, for the message.

        Raises:
            InputError: the service has no ``cold_start_s`` (naming this file, the
                service's header line and the key).
        """
        spec = self.specs[name]
        if spec.cold_start_s is None:
            raise InputError(
                self.path,
                self.lines.get(name, 0),
                "cold_start_s",
                f"service {name!r} has none, and the simulator needs one for every "
                f"service a workload uses ({used_at})",
            )
        return spec


def read_services_file(path: str | Path) -> ServicesFile:
    """Read a services file for the simulator (read once: a pipe works).

    Raises:
        InputError: unreadable file, bad TOML or a bad service (the file, the line of
            the service's ``[[service]]`` header and the key).
    """
    where = str(path)
    raw, text = read_document(path)
    specs = parse_services(raw, where, text)
    lines = header_lines(text)
    return ServicesFile(
        where,
        MappingProxyType({s.name: s for s in specs}),
        MappingProxyType(
            {s.name: (lines[i] if i < len(lines) else 0) for i, s in enumerate(specs)}
        ),
    )


def bind_services(workload: Workload, services: ServicesFile) -> Workload:
    """``workload`` with its services' specs taken from ``services``: every service
    its inference tasks name must be one of the file's, with a cold start; each
    task's model becomes its service's (a label).

    Raises:
        InputError: a task's service is not in the file, or has no ``cold_start_s``.
    """
    used: dict[str, ServiceSpec] = {}
    tasks = []
    # A workload read without a services file names its services by the whole row
    # ("infer-bert-1"); with one, by what follows "infer-" ("bert-1"), as here.
    renamed = not workload.services
    for t in workload.inference:
        if renamed and t.service.startswith(INFER_PREFIX):
            t = dataclasses.replace(t, service=t.service[len(INFER_PREFIX) :])
        spec = used.get(t.service)
        if spec is None:
            if t.service not in services.specs:
                raise InputError(
                    services.path,
                    0,
                    "name",
                    f"no service {t.service!r}, which task {t.name!r} of workload "
                    f"{workload.name!r} names; {services.known()}",
                )
            spec = used[t.service] = services.for_simulation(
                t.service, f"task {t.name!r} of workload {workload.name!r}"
            )
        tasks.append(t if t.model == spec.model else dataclasses.replace(t, model=spec.model))
    return dataclasses.replace(workload, inference=tuple(tasks), services=tuple(used.values()))
