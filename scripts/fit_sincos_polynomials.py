#!/usr/bin/env python3
"""Fits the polynomials of kernels/cpu/sincos_via_double.h.

On |r| <= pi/4 (r2 = r * r):
    sin r = r * (1 + r2 * P(r2)),         P of degree 3
    cos r = 1 - r2 / 2 + r2 * r2 * Q(r2),  Q of degree 3
Each is a weighted least-squares fit on Chebyshev nodes in r2, weighted for
relative error (close to the minimax polynomial of that degree), and the
script prints the coefficients with their maximum relative error over a fine
grid.  Taylor polynomials of the same degrees are ~2^-28.6 (sin) and
~2^-32.5 (cos) off at pi/4; these fits are ~2^-37 and ~2^-42, far below the
2^-24 of a float32 result.  tests/kernels/sincos_accuracy_test.cc checks the
resulting sin/cos against float64 (every float32 angle below the limit with
TEMB_SINCOS_STRIDE=1).

Usage: scripts/fit_sincos_polynomials.py   (numpy)
"""
import numpy as np

LIMIT = np.pi / 4 + 1e-6  # |r| a hair above pi/4: ties in the reduction
NODES = 4000


def fit(values, weights, r2):
    basis = np.stack([r2 ** k for k in range(4)], axis=1) * weights[:, None]
    return np.linalg.lstsq(basis, values * weights, rcond=None)[0]


def main():
    r2 = (np.cos(np.pi * (np.arange(NODES) + 0.5) / NODES) + 1) / 2 * LIMIT**2
    r = np.sqrt(r2)
    p = fit((np.sin(r) / r - 1) / r2, r2 / (np.sin(r) / r), r2)
    q = fit((np.cos(r) - 1 + r2 / 2) / r2**2, r2**2 / np.cos(r), r2)
    grid = np.linspace(1e-4, LIMIT, 400001)
    g2 = grid * grid
    sin_err = np.max(np.abs(grid * (1 + g2 * np.polyval(p[::-1], g2))
                            - np.sin(grid)) / np.sin(grid))
    cos_err = np.max(np.abs(1 - g2 / 2 + g2 * g2 * np.polyval(q[::-1], g2)
                            - np.cos(grid)) / np.cos(grid))
    print("P (sin), r2^0..r2^3:", ", ".join(repr(float(c)) for c in p))
    print(f"  max relative error 2^{np.log2(sin_err):.1f}")
    print("Q (cos), r2^0..r2^3:", ", ".join(repr(float(c)) for c in q))
    print(f"  max relative error 2^{np.log2(cos_err):.1f}")


if __name__ == "__main__":
    main()
