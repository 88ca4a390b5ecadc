"""Python's multiprocessing with the fork start method: workers read the parent's large array
(inherited by fork, never sent) and return sums; the parent prints their digest. Under a
preload shim the array is routed memory, which each forked worker must see as its parent's."""
import hashlib
import multiprocessing
import sys

import numpy as np

N = int(sys.argv[1]) if len(sys.argv) > 1 else 4_000_000
a = np.arange(N, dtype=np.float64) * 1.5


def part(i):
    return float(a[i::97].sum())


if __name__ == "__main__":
    with multiprocessing.get_context("fork").Pool(2) as pool:
        sums = pool.map(part, range(16))
    # The parent's array is still its own after the workers ran.
    sums.append(float(a.sum()))
    print(hashlib.sha256(np.array(sums).tobytes()).hexdigest())
