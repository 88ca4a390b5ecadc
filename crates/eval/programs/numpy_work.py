# numpy work for `pagewise eval dlm-programs` and the compatibility tests: FFT, matrix multiply
# and sort on arrays of N doubles (seeded, so every run computes the same thing), printing
# digests that do not depend on where the arrays live.
#
# The matrix holds small integers, so its product is exact in float64 whatever order BLAS sums
# in; the FFT of integers is rounded to 1e-3 before hashing (its rounding error is ~1e-9); the
# sort is exact. Usage: python3 numpy_work.py N
import hashlib
import sys

import numpy as np

n = int(sys.argv[1])
rng = np.random.default_rng(12345)

x = rng.integers(0, 1000, size=n).astype(np.float64)
f = np.fft.rfft(x)
spectrum = np.round(np.abs(f), 3)
print("fft", hashlib.sha256(spectrum.tobytes()).hexdigest()[:32])

side = max(16, int((n // 4) ** 0.5))
a = rng.integers(-8, 8, size=(side, side)).astype(np.float64)
b = rng.integers(-8, 8, size=(side, side)).astype(np.float64)
c = a @ b
print("matmul", side, hashlib.sha256(c.tobytes()).hexdigest()[:32])

y = rng.random(n)
y.sort()
print("sort", hashlib.sha256(y.tobytes()).hexdigest()[:32], bool(np.all(y[1:] >= y[:-1])))
