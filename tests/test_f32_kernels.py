"""The float32 FMA the ggml candidates are built on: rounded once, exactly, in numpy and compiled."""

from __future__ import annotations

import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from backends.kernels.f32_jit import fma32
from backends.kernels.f32_ops import fma


@njit
def _compiled(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    out = np.empty(a.size, dtype=np.float32)
    for i in range(a.size):
        out[i] = fma32(a[i], b[i], c[i])
    return out


def _round_to_float32(exact: Fraction) -> np.float32:
    """The float32 nearest `exact`, ties to the even mantissa."""
    near = np.float32(float(exact))
    around = (np.nextafter(near, np.float32(-np.inf)), near, np.nextafter(near, np.float32(np.inf)))
    return min(around, key=lambda v: (abs(Fraction(float(v)) - exact), int(np.array(v).view(np.uint32)) & 1))


def _tie_prone(count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """c = an odd-mantissa float32 (1 + k*2^-23) * 2^s, and a*b = half its ulp minus 2^-46 of that
    half: (1 + 2^-23) * (1 - 2^-23) * 2^(s-24). The exact sum lies just below the midpoint
    between c and its even neighbour; float64 cannot hold it and lands on the midpoint, and a
    second rounding would then break the tie toward the even neighbour, the wrong way."""
    rng = np.random.default_rng(5)
    k = rng.integers(0, 2**22, size=count) * 2 + 1
    scale = np.exp2(rng.integers(-20, 20, size=count))
    sign = rng.choice([-1.0, 1.0], size=count)
    c = (sign * (1 + k * 2.0**-23) * scale).astype(np.float32)
    a = (sign * (1 + 2.0**-23)).astype(np.float32)
    b = ((1 - 2.0**-23) * 2.0**-24 * scale).astype(np.float32)
    return a, b, c


def test_fma_rounds_the_exact_sum_once_to_nearest_even_ties_included() -> None:
    a, b, c = _tie_prone(3000)
    exact = [_round_to_float32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))) for x, y, z in zip(a, b, c, strict=True)]
    expected = np.array(exact, dtype=np.float32).view(np.uint32)
    double_rounded = (a.astype(np.float64) * b + c).astype(np.float32).view(np.uint32)
    assert (double_rounded != expected).sum() > 0, "the sample must hold ties that rounding twice breaks the wrong way"
    assert np.array_equal(fma(a, b, c).view(np.uint32), expected)
    assert np.array_equal(_compiled(a, b, c).view(np.uint32), expected)


def test_the_compiled_fma_gives_the_numpy_fmas_bits_over_every_magnitude() -> None:
    rng = np.random.default_rng(6)
    count = 1_000_000
    a, b = rng.normal(size=count).astype(np.float32), rng.normal(size=count).astype(np.float32)
    c = (rng.normal(size=count) * np.exp2(rng.integers(-40, 40, size=count))).astype(np.float32)
    assert np.array_equal(_compiled(a, b, c).view(np.uint32), fma(a, b, c).view(np.uint32))


_THREADS_SCRIPT = """
import sys, threading
import numpy as np
from numba import njit, prange
from backends.kernels import f32_jit

@njit(parallel=True)
def unguarded(w, x):
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    for o in prange(w.shape[0]):
        for r in range(x.shape[0]):
            acc = np.float32(0)
            for i in range(w.shape[1]):
                acc += w[o, i] * x[r, i]
            out[r, o] = acc
    return out

w, x = np.ones((512, 256), np.float32), np.ones((16, 256), np.float32)
kernel = unguarded if sys.argv[1] == "unguarded" else (lambda w, x: f32_jit.dot_tinyblas(w, x, True))
results = []
def work():
    for _ in range(30):
        results.append(float(kernel(w, x)[0, 0]))
threads = [threading.Thread(target=work) for _ in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(len(results), sorted(set(results)))
"""


def test_threads_launching_kernels_at_once_never_end_the_process_even_on_numbas_workqueue_layer() -> None:
    """The viewer's workers may overlap. On the workqueue threading layer (macOS, Linux without
    libgomp) two parallel launches at once terminate the process, as the unguarded kernel shows;
    the kernels here take turns."""
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"}
    root = Path(__file__).resolve().parents[1]

    def run(which: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, which], env=env, cwd=root, capture_output=True, text=True, timeout=300)

    unguarded = run("unguarded")
    assert unguarded.returncode != 0 and "Concurrent access has been detected" in unguarded.stderr
    guarded = run("guarded")
    assert guarded.returncode == 0, guarded.stderr
    assert guarded.stdout.split() == ["90", "[256.0]"]


def test_an_overflowing_sum_keeps_its_sign_and_one_just_below_the_overflow_midpoint_is_the_largest_float32() -> None:
    top = np.finfo(np.float32).max
    a = np.array([1e30, -1e30, 4188889 * 2.0**30, -4188889 * 2.0**30], dtype=np.float32)
    b = np.array([1e30, 1e30, 2099863 * 2.0**30, 2099863 * 2.0**30], dtype=np.float32)
    c = np.array([-1, 1, top, -top], dtype=np.float32)
    expected = np.array([np.inf, -np.inf, top, -top], dtype=np.float32)
    assert np.array_equal(_compiled(a, b, c), expected)
    assert np.array_equal(fma(a, b, c), expected)


def test_shapes_that_do_not_fit_are_refused_before_a_compiled_kernel_reads_past_them() -> None:
    from backends.kernels import ggml_cpu

    with pytest.raises(ValueError, match=r"activations \(3, 64\) with weights \(4, 16\) needs one shared width, a multiple of 8"):
        ggml_cpu.dot_tinyblas(np.ones((4, 16)), np.ones((3, 64)))
    with pytest.raises(ValueError, match="needs one shared width"):
        ggml_cpu.dot_vec_f32(np.ones((4, 12)), np.ones((3, 16)))
    with pytest.raises(ValueError, match="the heads or widths do not fit"):
        ggml_cpu.flash_attention(np.ones((4, 2, 64)), np.ones((2, 3, 32)), np.ones((2, 3, 32)), scale=1.0, causal=True)
