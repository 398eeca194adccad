"""The accumulation models against a real tl.dot.

* On a CUDA GPU (sm_90, @pytest.mark.gpu): one tl.dot over K (fp16 -> Hopper fp16 wgmma, k = 16 per step;
  E4M3FN -> fp8 wgmma, k = 32, never promoted inside a dot), fp32 accumulator stored unrounded. Every element must
  lie within eps_acc(K) |A||B| of the exact sum for the declared preset (soundness on hardware); the fraction that
  agrees BIT FOR BIT with fp4ref.bounds.simulate of the preset is printed (evidence for the model's parameters,
  not asserted: the chaining order of the k-steps inside one tl.dot is Triton's choice).
* In the Triton CPU interpreter (CI): tl.dot is a numpy fp32 matmul, so the kernels' declared interpreter model
  ``fp32_rn`` must hold.
Inputs: adversarial fp16 magnitude patterns and E4M3FN bytes with subnormals and 448 (fp4ref.strategies).
"""
from __future__ import annotations

import math
import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fp4ref import bounds
from fp4ref import strategies as fst

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
E4M3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
BM, BN = 64, 64


@triton.jit
def dot_probe_kernel(
    a_ptr,  # *fp16 or *u8 (E4M3FN bytes) [BM, K]
    b_ptr,  # same dtype, [BN, K]
    c_ptr,  # *fp32 [BM, BN]: the accumulator, stored without rounding
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP8: tl.constexpr,
):
    # One tl.dot over the whole K: acc = A @ B.T accumulated in fp32 by the tensor cores.
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rn[:, None] * K + rk[None, :])
    if FP8:
        a = a.to(tl.float8e4nv, bitcast=True)
        b = b.to(tl.float8e4nv, bitcast=True)
    acc = tl.dot(a, tl.trans(b), out_dtype=tl.float32)
    tl.store(c_ptr + rm[:, None] * BLOCK_N + rn[None, :], acc)


def _probe(a_np, b_np, fp8: bool) -> np.ndarray:
    K = a_np.shape[1]
    a = torch.from_numpy(a_np).to(DEVICE)
    b = torch.from_numpy(b_np).to(DEVICE)
    c = torch.full((BM, BN), float("nan"), dtype=torch.float32, device=DEVICE)
    dot_probe_kernel[(1,)](a, b, c, K=K, BLOCK_M=BM, BLOCK_N=BN, FP8=fp8, num_warps=4)
    return c.cpu().numpy().astype(np.float64)


def _excess(acc, A64, B64, model):
    exact = np.array([[math.fsum(A64[i] * B64[j]) for j in range(B64.shape[0])] for i in range(A64.shape[0])])
    P = np.abs(A64) @ np.abs(B64).T
    eps = bounds.get_model(model).eps(A64.shape[1])
    return float(np.max(np.abs(acc - exact) - eps * P * (1 + 2.0**-40)))


K_VALUES = st.sampled_from([16, 32, 64, 128, 256])


@settings(max_examples=10)
@given(K=K_VALUES, data=st.data())
def test_fp16_dot_within_model(K, data):
    A = data.draw(fst.fp16_matrices((BM, K), max_exponent=6, min_exponent=-12))
    B = data.draw(fst.fp16_matrices((BN, K), max_exponent=6, min_exponent=-12))
    acc = _probe(A, B, fp8=False)
    model = "hopper_fp16_wgmma" if ON_GPU else "fp32_rn"
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    assert _excess(acc, A64, B64, model) <= 0
    if ON_GPU:
        same = np.mean(acc == bounds.simulate(A, B, model))
        print(f"fp16 K={K}: {100 * same:.1f}% bitwise equal to bounds.simulate({model!r})")


@settings(max_examples=10)
@given(K=K_VALUES.filter(lambda k: k >= 32), data=st.data())
def test_fp8_dot_within_model(K, data):
    a = data.draw(fst.e4m3_bytes((BM, K)))
    b = data.draw(fst.e4m3_bytes((BN, K)))
    acc = _probe(a, b, fp8=True)
    model = "hopper_fp8_wgmma" if ON_GPU else "fp32_rn"
    A64, B64 = E4M3[a], E4M3[b]
    assert _excess(acc, A64, B64, model) <= 0
    if ON_GPU:
        same = np.mean(acc == bounds.simulate(A64, B64, model))
        print(f"fp8 K={K}: {100 * same:.1f}% bitwise equal to bounds.simulate({model!r})")


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (sm_90)")
def test_fp8_dot_is_not_fp32_accurate_on_hopper():
    # The point of the fp8 preset: with all-positive operands at K = 256 the 14-bit accumulator is visibly worse
    # than fp32 RN summation would be (an fp32-accumulating model would be too optimistic on Hopper fp8).
    rng = np.random.default_rng(0)
    a = np.abs(rng.standard_normal((BM, 256))).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    b = np.abs(rng.standard_normal((BN, 256))).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    acc = _probe(a, b, fp8=True)
    A64, B64 = E4M3[a], E4M3[b]
    assert _excess(acc, A64, B64, "hopper_fp8_wgmma") <= 0
    assert _excess(acc, A64, B64, "fp32_rn") > 0
