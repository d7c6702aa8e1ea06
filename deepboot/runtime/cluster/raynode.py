"""Run Ray's own ``ray start`` for a worker node of a loopback-only local cluster.

Why this exists: Ray replaces a node address of 127.0.0.1 with the machine's
routable address unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, and with that
setting its CLI refuses to start a second node. With the routable address, three of
Ray's Prometheus endpoints listen on every interface with no authentication. For a
cluster that ``deepboot up`` starts on one machine we want every socket on loopback,
so the deepboot processes run with the setting at 0 (node address 127.0.0.1) and this
launcher lifts only the CLI's multi-node check, for the CLI process alone. It changes
nothing else of Ray; ``tests/runtime/test_security.py`` checks the sockets.

Usage: ``python -m deepboot.runtime.cluster.raynode start --address=127.0.0.1:PORT ...``
(the arguments of ``ray start``).
"""

from __future__ import annotations

import sys
import types
from typing import Any


def main() -> int:
    import ray._private.ray_constants as constants
    import ray.scripts.scripts as scripts

    class _Constants(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            return getattr(constants, name)

    shim = _Constants("ray_constants_for_the_cli")
    shim.ENABLE_RAY_CLUSTER = True  # type: ignore[attr-defined]
    scripts.ray_constants = shim  # type: ignore[attr-defined]
    result = scripts.main()  # type: ignore[no-untyped-call]
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
