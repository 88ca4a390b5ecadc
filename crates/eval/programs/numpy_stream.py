# numpy streaming for `pagewise eval dlm-programs`: a file read through np.memmap into an array,
# widened to 64-bit integers, scaled, summed and counted. Each step sweeps arrays larger than
# local memory once, front to back, with no reuse: the case where a large paging unit is
# fastest (a numpy script found it: the tuner settled at 4 KiB and took 7x the best fixed size).
# Prints digests that do not depend on where the arrays live. Usage: python3 numpy_stream.py FILE
import hashlib
import sys

import numpy as np

m = np.memmap(sys.argv[1], dtype=np.uint8, mode="r")
a = np.array(m)
w = a.astype(np.int64)
print("sum", int(w.sum()))
w *= 3
print("scaled", int(w[::4096].sum()))
print("counts", hashlib.sha256(np.bincount(a, minlength=256).tobytes()).hexdigest()[:32])
