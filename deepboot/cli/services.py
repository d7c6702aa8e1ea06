"""``--services FILE`` of ``deepboot simulate`` and ``deepboot compare``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from deepboot.cli.files import require_path

if TYPE_CHECKING:
    from deepboot.sim.services import ServicesFile

SERVICES_EPILOG = """\
Inference services from a services file (--services FILE): one TOML file with a
[[service]] table per service, the keys of 'deepboot serve' (handler optional and
unused here). The workload's inference rows then name its services, application =
"infer-<name>" (every such row must name one of them); a service's model is a label,
its cold start is its cold_start_s (required for every service the workload uses),
one replica serves up to concurrency tasks at once (a task that finds every replica
of its service full starts another), and max_replicas caps its replicas. Its SLO:
a request meets it when it starts within slo_wait_s (default 1 s); slo_target of
its requests should (default 0.99); guaranteed_replicas are never lent. Every run
reports the attainment (docs/slo.md):

  # services.toml
  [[service]]
  name = "sd-xl"             # rows: ...,infer-sd-xl,1,1,<duration>,<num_task>
  model = "stable-diffusion-xl"
  cold_start_s = 22.7
  concurrency = 2
  max_replicas = 4
  slo_wait_s = 45.0
  slo_target = 0.95

  deepboot simulate --workload genai.csv --services services.toml --policy deepboot \\
      --cluster 16x4 --inference-nodes 8"""


def add_services_flag(p: argparse.ArgumentParser) -> None:
    """The ``--services FILE`` flag (see :data:`SERVICES_EPILOG`)."""
    p.add_argument(
        "--services",
        metavar="FILE",
        help="services file ([[service]] tables: name, model, cold_start_s, concurrency, "
        "max_replicas, slo_wait_s, slo_target, guaranteed_replicas): the workload's "
        "inference rows name its services (application infer-<name>); see the services "
        "example below",
    )


def read_services_arg(path: str | None) -> ServicesFile | None:
    """The services file of ``--services``, read once (None without the flag).

    Raises:
        ConfigError: an empty path.
        InputError: a bad file (naming it, the service's line and the key).
    """
    if path is None:
        return None
    from deepboot.sim.services import read_services_file

    return read_services_file(require_path(path, "--services"))
