"""Suite-wide settings.

The simulator's matrices are tiny; BLAS thread pools only add contention on 2 cores
(the online L-BFGS-B fits ran 7-15x slower with them). This must run before numpy is
imported, hence at the top of the root conftest; an explicit setting still wins.
"""

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# The suite checks its tables at rich's width for a pipe (80 columns); a COLUMNS the
# user's shell exports would change them (a table checked to fit 80 columns, found
# on a fresh clone run with COLUMNS=100). A test that wants a width sets its own.
for _var in ("COLUMNS", "LINES"):
    os.environ.pop(_var, None)

# Hypothesis fails an example that runs past its deadline (200 ms by default): a
# wall-clock threshold, which a loaded 2-core machine trips. No test of this suite
# has one; every hypothesis test inherits this profile (an explicit setting wins).
from hypothesis import settings  # noqa: E402

settings.register_profile("deepboot", deadline=None)
settings.load_profile("deepboot")


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    """After a run that collected the docs runner's tests: how many of the docs'
    command blocks it runs, and how many it does not (each with a stated reason)."""
    collected = getattr(terminalreporter, "_numcollected", 0)
    ran_docs = any(
        "test_docs_commands.py" in str(getattr(r, "nodeid", ""))
        for outcome in ("passed", "failed", "error", "skipped")
        for r in terminalreporter.stats.get(outcome, ())
    )
    if collected and ran_docs:
        from tests.test_docs_commands import count_line

        terminalreporter.write_line(count_line())
