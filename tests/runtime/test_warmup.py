"""The controller's kernel warm-up: every compiled kernel the loop calls is loaded."""

from __future__ import annotations

import subprocess
import sys

import pytest

from deepboot.core.errors import ConfigError
from deepboot.runtime.controller.warmup import warm_kernels

# In a fresh interpreter: in this one another test may have loaded them already.
PROBE = """
from deepboot.perf import _fitkernel, _goodputkernel
from deepboot.policies import _slotkernel
kernels = (_fitkernel._lm, _goodputkernel.throughput_rows, _slotkernel.slot_knapsack)
assert not any(k.signatures for k in kernels), "loaded before the warm-up"
from deepboot.runtime.controller.warmup import warm_kernels
warm_kernels({policy!r}, {{}})
print(sorted(k.__name__ for k in kernels if k.signatures))
"""


@pytest.mark.parametrize("policy", ["deepboot", "pollux"])
def test_the_warm_up_loads_every_kernel_the_loop_calls(policy: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(policy=policy)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['_lm',", "'slot_knapsack',", "'throughput_rows']"]


def test_an_unknown_policy_is_refused_as_the_loop_would() -> None:
    with pytest.raises(ConfigError):
        warm_kernels("no-such-policy", {})
