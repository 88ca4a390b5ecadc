# The numpy pattern of issue 22 for `pagewise eval hps-programs`: an array of SIZE_MIB MiB,
# ROUNDS rounds of GATHERS random gathers inside its first HOT_MIB MiB; each gather allocates
# and frees a temporary (the gathered values), as plain numpy code does. numpy asks for THP
# itself (madvise(MADV_HUGEPAGE) on large arrays). Prints each round's time and a checksum of
# the gathered values (seeded: the same in every run).
#
# Usage: python3 hps_gather.py SIZE_MIB HOT_MIB ROUNDS GATHERS
import sys
import time

import numpy as np

size_mib, hot_mib, rounds, gathers = (int(v) for v in sys.argv[1:5])
n = size_mib * (1 << 20) // 8
hot = hot_mib * (1 << 20) // 8
a = np.arange(n, dtype=np.float64)
rng = np.random.default_rng(7)
total = 0.0
for r in range(rounds):
    idx = rng.integers(0, hot, size=gathers)
    t = time.perf_counter()
    s = a[idx].sum()
    print("round", r, "%.6f" % (time.perf_counter() - t), flush=True)
    total += s
print("checksum %.1f" % total)
