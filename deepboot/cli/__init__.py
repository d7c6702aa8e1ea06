"""The ``deepboot`` command line (entry point: :func:`deepboot.cli.main.entry`)."""

import os

# The simulator is single-threaded; BLAS thread pools only add contention on its tiny
# matrices (the online L-BFGS-B throughput fits ran ~7x slower with them on 2 cores).
# This must run before numpy is imported; a user's explicit setting still wins.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
