"""Suite-wide settings.

The simulator's matrices are tiny; BLAS thread pools only add contention on 2 cores
(the online L-BFGS-B fits ran 7-15x slower with them). This must run before numpy is
imported, hence at the top of the root conftest; an explicit setting still wins.
"""

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
