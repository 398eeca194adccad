"""The three workloads fp4ref verifies (docs/verify.md): shapes, input families and exact references.

Pure numpy: a workload describes its operands as numpy arrays and computes its :class:`fp4ref.gemm.Reference`;
:mod:`fp4ref.verify` moves the operands to torch and runs a kernel on them.

Input families. ``public`` reproduces the public benchmark's input distribution; the others are adversarial and
exist to catch bugs a loose tolerance cannot see:

=====================  ===============================================================================================
workload               families
=====================  ===============================================================================================
gemm_n3072_k2048       ``public`` (randn fp16); ``exact_acc`` (scaled integers: every fp32 partial sum is exact in any
                       order, yet the fp16 output needs rounding, with exact ties; mirrored same-sign runs take every
                       partial sum past 2^11: catches truncating stores, fp16/bf16 accumulation, wrong tie rule);
                       ``extreme`` (rows whose exact results overflow fp16 at every K, subnormal rows,
                       heavy cancellation).
sparse_gemm_fp4_fp8    ``public`` (random int8 vals/meta bytes, as the benchmark feeds them: every byte is defined);
_n2048_k2048           ``canonical`` (compress_2to4 output); ``exact_acc`` (E4M3FN integer B: sums exact in fp32 and
                       in fp8 wgmma promoted every <= 128; a same-sign run takes every partial sum past 2^13, so an
                       unpromoted 14-bit accumulator fails); ``nan_b`` (E4M3FN NaN bytes in B must propagate);
                       ``subnormal_b`` (B only E4M3FN subnormals, sums exact: catches a decode that flushes them).
nvfp4_linear           ``public`` (randn bf16 activations, randn fp32 weights quantized with the "sol" recipe);
_n8192_k8192           ``adversarial`` (activation blocks of zeros, E2M1 ties, huge and tiny blocks: subnormal
                       block scales); ``exact_acc`` (x and W on grids whose fp32 partial sums are exact in any
                       order, the global scales' product a power of two: the output must be RNE of the exact sum).
=====================  ===============================================================================================
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import ml_dtypes
import numpy as np

__all__ = ["NVFP4_X_RECIPE", "Workload", "WORKLOADS", "get_workload"]


@dataclass(frozen=True)
class Workload:
    """One workload: the kernel signature it fixes, its sizes, its input families and its reference.

    Attributes:
        name: the public benchmark's name.
        kernel: "module:function" of the project's kernel for it (imported only by fp4ref.verify).
        args: names of the kernel's positional arguments, in order (the workload's signature).
        output_dtype: "float16" or "bfloat16".
        n, k: the fixed dimensions.
        gpu_m: the M values of the public benchmark (run on a CUDA GPU).
        cpu_m: small M values for the Triton CPU interpreter.
        cpu_n, cpu_k: N and K in the Triton CPU interpreter (None: the full ``n`` / ``k``); chosen so that the
            default ``fp4ref verify`` stays within minutes on two cores while every family keeps its property
            (the exact-accumulation runs still pass the accumulators they target: tests/test_exact_families.py).
        families: family name -> callable(rng, m, n, k) -> dict of numpy operands (keys = ``args``).
        reference: callable(**operands) -> fp4ref.gemm.Reference.
        description: one line.
        batched: x and y carry a leading batch dimension of 1 (the NVFP4-linear workload's [batch, seq, K]).
        exact_families: families whose inputs make every fp32 partial sum exact in any order: there the output must
            equal the correctly rounded one (faithful: one of its two neighbours), whatever the model.
        hypothesis_families: families built with :mod:`fp4ref.strategies`' array constructions, which import
            hypothesis (``fp4ref verify`` names it as a missing dependency for them).
        slice_rows: callable(operands, rows) -> operands restricted to those output rows, with the same reference
            values there (None: the reference must see the whole input, e.g. a per-tensor amax).
    """

    name: str
    kernel: str
    args: tuple
    output_dtype: str
    n: int
    k: int
    gpu_m: tuple
    cpu_m: tuple
    families: dict
    reference: Callable
    description: str
    slice_rows: Callable | None = None
    exact_families: tuple = ()
    hypothesis_families: tuple = ()  # families built with fp4ref.strategies' arrays, which import hypothesis
    batched: bool = False  # operands and output carry a leading batch dimension of 1 ([1, M, ...])
    cpu_n: int | None = None
    cpu_k: int | None = None

    def dims(self, interpreted: bool = False) -> tuple:
        """(N, K) on a GPU (``interpreted=False``) or in the Triton CPU interpreter."""
        if not interpreted:
            return self.n, self.k
        return self.cpu_n or self.n, self.cpu_k or self.k

    def output_shape(self, m: int, n: int | None = None) -> tuple:
        """Shape of the kernel's output for M rows (and N columns, default the workload's ``n``)."""
        n = self.n if n is None else n
        return (1, m, n) if self.batched else (m, n)


# ------------------------------------------------------------------------------------------- gemm_n3072_k2048


def _f16(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def _gemm_public(rng, m, n, k):
    return {"A": _f16(rng.standard_normal((m, k))), "B": _f16(rng.standard_normal((n, k)))}


def _gemm_exact_acc(rng, m, n, k):
    # fp4ref.strategies' construction: integers scaled by powers of two, every fp32 partial sum exact in any order
    # and any tensor-core alignment, while the fp16 outputs need rounding (with exact ties).
    from .strategies import exact_accumulation_fp16_arrays

    a, b = exact_accumulation_fp16_arrays(rng, m, n, k)
    return {"A": a, "B": b}


def _gemm_extreme(rng, m, n, k):
    """Rows 0, 3, 6, ... of A and rows 0, 7, 14, ... of B (those the pairs below leave: 0, 14, 28, ...) hold
    2^ea (1 + |randn|) and 2^eb (1 + |randn|), each entry at least its power of two (exact in fp16), with
    k 2^(ea + eb) in (2^16, 2^17]: every dot product of two such rows is above 2^16 > 65520, past fp16's overflow
    threshold (65504 + half an ulp), so the correctly rounded output is inf at every K; ea <= 8 and eb <= 9 keep the
    entries far inside fp16's range. Rows 1, 4, 7, ... of A are randn * 2^-14 (subnormal range); B's odd rows
    are its even rows negated and scaled by 1 + 2^-10 (near-cancelling column pairs)."""
    a = rng.standard_normal((m, k))
    b = rng.standard_normal((n, k))
    rows = np.arange(m)
    e = 17 - (int(k) - 1).bit_length()  # (k - 1).bit_length() = ceil(log2 k): k 2^e in (2^16, 2^17]
    ea = min(e, 8)
    a[rows % 3 == 0] = 2.0**ea * (1 + np.abs(a[rows % 3 == 0]))
    b[0::7] = 2.0 ** (e - ea) * (1 + np.abs(b[0::7]))
    a[rows % 3 == 1] *= 2.0**-14  # subnormal-range inputs and outputs
    if n > 1:
        b[1::2] = -b[0::2][: b[1::2].shape[0]] * (1 + 2.0**-10)  # near-cancelling column pairs
    return {"A": _f16(a), "B": _f16(b)}


def _slice_first(*names):
    def slice_rows(ops, rows):
        return {k: (v[rows] if k in names else v) for k, v in ops.items()}

    return slice_rows


def _gemm_reference(A, B):
    from .gemm import gemm_fp16

    return gemm_fp16(A, B)


# ------------------------------------------------------------------------------- sparse_gemm_fp4_fp8_n2048_k2048


def _e4m3_bytes(x) -> np.ndarray:
    from .formats import E4M3FN, encode

    return encode(np.asarray(x, dtype=np.float32), E4M3FN)


def _sparse_public(rng, m, n, k):
    return {
        "a_vals": rng.integers(-128, 128, size=(m, k // 4), dtype=np.int8),
        "a_meta": rng.integers(-128, 128, size=(m, k // 4), dtype=np.int8),
        "b_fp8": _e4m3_bytes(rng.standard_normal((n, k))).view(ml_dtypes.float8_e4m3fn),
    }


def _sparse_canonical(rng, m, n, k):
    from .packing import compress_2to4

    codes = rng.integers(0, 16, size=(m, k)).astype(np.uint8)
    keep = np.zeros((m, k // 4, 4), dtype=bool)
    for g in range(2):  # two random (possibly equal) positions per group; equal positions keep one value
        keep[np.arange(m)[:, None], np.arange(k // 4)[None, :], rng.integers(0, 4, size=(m, k // 4))] = True
    codes = np.where(keep.reshape(m, k), codes, 0).astype(np.uint8)
    vals, meta = compress_2to4(codes)
    return {
        "a_vals": vals.view(np.int8),
        "a_meta": meta.view(np.int8),
        "b_fp8": _e4m3_bytes(rng.standard_normal((n, k))).view(ml_dtypes.float8_e4m3fn),
    }


def _sparse_exact_acc(rng, m, n, k):
    # fp4ref.strategies' construction with promotion every 128 products: exact for any fp32-accumulating kernel and
    # for Hopper fp8 wgmma promoted at least every 128 K-elements, while the sums need more than the 14 bits of an
    # unpromoted fp8 accumulator (which this family therefore catches); any meta byte.
    from .strategies import exact_accumulation_sparse_arrays

    vals, meta, b = exact_accumulation_sparse_arrays(rng, m, n, k, promote_every=128, canonical=False)
    return {"a_vals": vals.view(np.int8), "a_meta": meta.view(np.int8), "b_fp8": b.view(ml_dtypes.float8_e4m3fn)}


def _sparse_subnormal_b(rng, m, n, k):
    # B only E4M3FN subnormals (m * 2^-9, m = 1..7, either sign) under any A bytes: every product lies on 2^-10 Z and
    # a chunk of 128 K-columns sums to at most 32 groups * 12 * 7 * 2^-9 = 5.25 (5376 steps < 2^13), so the sums are
    # exact in fp32 at any K <= 2^12 and in fp8 wgmma promoted every <= 128; a kernel that flushes subnormal B
    # bytes to zero (an FTZ decode or conversion) gives zeros, which this family shows bit for bit.
    mags = rng.integers(1, 8, size=(n, k)).astype(np.uint8)
    signs = (rng.integers(0, 2, size=(n, k)) * 0x80).astype(np.uint8)
    return {
        "a_vals": rng.integers(-128, 128, size=(m, k // 4), dtype=np.int8),
        "a_meta": rng.integers(-128, 128, size=(m, k // 4), dtype=np.int8),
        "b_fp8": (mags | signs).view(ml_dtypes.float8_e4m3fn),
    }


def _sparse_nan_b(rng, m, n, k):
    out = _sparse_public(rng, m, n, k)
    b = out["b_fp8"].view(np.uint8).copy()
    idx = rng.integers(0, b.size, size=max(1, b.size // 4096))
    b.reshape(-1)[idx] = rng.choice(np.array([0x7F, 0xFF], dtype=np.uint8), size=idx.size)
    out["b_fp8"] = b.view(ml_dtypes.float8_e4m3fn)
    return out


def _sparse_reference(a_vals, a_meta, b_fp8):
    from .gemm import sparse_gemm_fp4_fp8

    return sparse_gemm_fp4_fp8(a_vals, a_meta, b_fp8)


# --------------------------------------------------------------------------------- nvfp4_linear_n8192_k8192

_WEIGHT_CACHE: dict = {}


def _nvfp4_weight(seed: int, n: int, k: int) -> dict:
    """randn fp32 [n, k] weights quantized with the workload's own recipe ("sol"), cached per (seed, n, k)."""
    key = (seed, n, k)
    if key not in _WEIGHT_CACHE:
        from .blockscale import nvfp4_quantize

        w = np.random.default_rng(seed).standard_normal((n, k), dtype=np.float32)
        q = nvfp4_quantize(w, recipe="sol")
        _WEIGHT_CACHE.clear()
        _WEIGHT_CACHE[key] = {
            "weight_fp4": q.codes,
            "weight_scales": q.scales.view(ml_dtypes.float8_e4m3fn),
            "weight_global_decode_scale": float(q.global_decode_scale),
        }
    return _WEIGHT_CACHE[key]


def _bf16(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16)


def _nvfp4_public(rng, m, n, k):
    w = _nvfp4_weight(1234, n, k)
    return {"x": _bf16(rng.standard_normal((1, m, k))), **w}


def _nvfp4_adversarial(rng, m, n, k):
    # The tensor amax is planted at 2688 = 448 * 6, so the "sol" global encode scale is exactly 1.0; then a block
    # with amax 6 gets block scale 1.0 and its elements reach the E2M1 rounding step unchanged: exact ties.
    w = _nvfp4_weight(1234, n, k)
    x = rng.standard_normal((m, k // 16, 16))
    kind = rng.integers(0, 5, size=(m, k // 16))
    x[kind == 0] = 0.0  # all-zero blocks: scale byte 0, codes 0, never NaN
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # E2M1 midpoints
    sel = kind == 1
    x[sel] = rng.choice(ties, size=(int(sel.sum()), 16)) * rng.choice([-1.0, 1.0], size=(int(sel.sum()), 16))
    x[sel, 0] = 6.0
    x[kind == 2] *= 2.0**-7  # block amax ~ 2^-6: block scale ~ 2^-8, an E4M3FN subnormal
    x[kind == 3] *= 2.0**7  # large blocks, block scales near 448
    x.reshape(-1)[0] = 2688.0
    return {"x": _bf16(x.reshape(1, m, k)), **w}


def _nvfp4_exact_acc(rng, m, n, k):
    # Every fp32 partial sum exact in any order, the bf16 output needing rounding (with ties). x: every block holds
    # +-2688 = 448 * 6 (the tensor amax, so the "sol" global scale is 1 and every block scale 448) and 448 * e2m1 at
    # the other elements, so x quantizes to exactly those codes; W: random codes, every block scale 1.0, global
    # decode scale 2^-3. Products x_deq * w_deq lie on 112 Z = 7 * 16 Z and a partial sum has at most
    # K * 448 * 36 / 112 = 144 K such units (7 * 144 K < 2^24 at K <= 16384): exact in fp32, and scaled by the power
    # of two 2^-3 exactly, so the output must be the correctly rounded RNE(C) (the workload's own double rounding
    # bf16(bf16(acc) * alpha) gives the same bits here). Catches truncating stores, a wrong tie rule, bf16 / fp16
    # accumulation.
    e2m1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    x = 448.0 * e2m1[rng.integers(0, 8, size=(m, k // 16, 16))] * rng.choice([-1.0, 1.0], size=(m, k // 16, 16))
    x[np.arange(m)[:, None], np.arange(k // 16)[None, :], rng.integers(0, 16, size=(m, k // 16))] = \
        2688.0 * rng.choice([-1.0, 1.0], size=(m, k // 16))
    from .packing import pack_fp4

    return {
        "x": _bf16(x.reshape(1, m, k)),
        "weight_fp4": pack_fp4(rng.integers(0, 16, size=(n, k)).astype(np.uint8)),
        "weight_scales": np.full((n, k // 16), 0x38, np.uint8).view(ml_dtypes.float8_e4m3fn),  # E4M3FN 1.0
        "weight_global_decode_scale": 0.125,
    }


#: The recipe the NVFP4-linear workload quantizes x with, per call (fp4ref.blockscale.NVFP4Recipe.SOL)
NVFP4_X_RECIPE = "sol"


def _nvfp4_reference(x, weight_fp4, weight_scales, weight_global_decode_scale, x_global_amax=None):
    from .gemm import nvfp4_linear

    if x_global_amax is None:
        return nvfp4_linear(x, weight_fp4, weight_scales, weight_global_decode_scale, recipe=NVFP4_X_RECIPE)
    # A row subset of a larger x: quantize it with the whole tensor's amax (the per-tensor global scale), which
    # gives exactly the rows that quantizing the whole x would (block scales are per row).
    from .blockscale import NVFP4Tensor, nvfp4_quantize
    from ._validate import global_scale_float32
    from .gemm import nvfp4_gemm

    k = x.shape[-1]
    xq = nvfp4_quantize(x.reshape(-1, k), recipe=NVFP4_X_RECIPE, global_amax=x_global_amax)
    n = weight_fp4.shape[0]
    wg = np.float32(global_scale_float32(weight_global_decode_scale, "weight_global_decode_scale"))
    wq = NVFP4Tensor(codes=np.asarray(weight_fp4).view(np.uint8), scales=np.asarray(weight_scales).view(np.uint8),
                     global_decode_scale=wg, shape=(n, k), recipe="sol", block=(1, 16), axis=1)
    ref = nvfp4_gemm(xq, wq)
    return ref if x.ndim == 2 else _reshape_reference(ref, x.shape[:-1] + (n,))


def _reshape_reference(ref, shape):
    from dataclasses import replace

    return replace(ref, out=ref.out.reshape(shape), exact=ref.exact.reshape(shape),
                   exact_err=np.broadcast_to(np.asarray(ref.exact_err), ref.out.shape).reshape(shape),
                   _absprod_fn=lambda f=ref._absprod_fn: f().reshape(shape), _cache={})


def _nvfp4_slice_rows(ops, rows):
    x = ops["x"]
    amax = float(np.max(np.abs(x.astype(np.float32)))) if x.size else 0.0
    return {**ops, "x": x[:, rows], "x_global_amax": amax}


# ----------------------------------------------------------------------------------------------------- registry

WORKLOADS: dict = {
    w.name: w
    for w in (
        Workload(
            name="gemm_n3072_k2048",
            kernel="fp4ref.kernels.gemm_fp16:gemm_fp16",
            args=("A", "B"),
            output_dtype="float16",
            n=3072,
            k=2048,
            gpu_m=(1, 2, 4, 7, 8, 15, 16, 24, 32, 35, 40, 48, 56, 64, 70, 72, 80, 88, 96, 104, 112, 120, 128, 136,
                   144, 152, 160, 168, 176, 184, 192, 200, 208, 216, 224, 232, 240, 248, 256, 972, 2053, 2379, 8192),
            cpu_m=(1, 7),
            cpu_n=512,
            cpu_k=1024,
            families={"public": _gemm_public, "exact_acc": _gemm_exact_acc, "extreme": _gemm_extreme},
            reference=_gemm_reference,
            description="C = A @ B.T, fp16 [M, 2048] x fp16 [3072, 2048] -> fp16 (FlashInfer-Bench)",
            slice_rows=_slice_first("A"),
            exact_families=("exact_acc",),
            hypothesis_families=("exact_acc",),
        ),
        Workload(
            name="sparse_gemm_fp4_fp8_n2048_k2048",
            kernel="fp4ref.kernels.sparse_gemm_fp4_fp8:sparse_gemm_fp4_fp8",
            args=("a_vals", "a_meta", "b_fp8"),
            output_dtype="bfloat16",
            n=2048,
            k=2048,
            gpu_m=(1, 7, 16, 64, 100, 256, 1024, 4096, 8192),
            cpu_m=(1, 5),
            cpu_n=128,  # K stays 2048: there the unpromoted fp8 model fails exact_acc on most elements
            families={
                "public": _sparse_public,
                "canonical": _sparse_canonical,
                "exact_acc": _sparse_exact_acc,
                "nan_b": _sparse_nan_b,
                "subnormal_b": _sparse_subnormal_b,
            },
            reference=_sparse_reference,
            description="2:4 sparse E2M1 A [M, 2048] x E4M3FN B [2048, 2048] -> bf16 (FlashInfer-Bench)",
            slice_rows=_slice_first("a_vals", "a_meta"),
            exact_families=("exact_acc", "subnormal_b"),
            hypothesis_families=("exact_acc",),
        ),
        Workload(
            name="nvfp4_linear_n8192_k8192",
            kernel="fp4ref.kernels.nvfp4_linear:nvfp4_linear",
            args=("x", "weight_fp4", "weight_scales", "weight_global_decode_scale"),
            output_dtype="bfloat16",
            n=8192,
            k=8192,
            gpu_m=(1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
            cpu_m=(1,),
            cpu_n=1024,
            cpu_k=2048,
            families={"public": _nvfp4_public, "adversarial": _nvfp4_adversarial, "exact_acc": _nvfp4_exact_acc},
            reference=_nvfp4_reference,
            description="y = x @ W.T, x bf16 quantized to NVFP4 per call ('sol'), NVFP4 W [8192, 8192] -> bf16 (SOL)",
            slice_rows=_nvfp4_slice_rows,
            batched=True,
            exact_families=("exact_acc",),
        ),
    )
}


def get_workload(name: str) -> Workload:
    """Return the workload named ``name``; ValueError listing the known names otherwise."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"workload (--workload)={name!r} is not known; expected one of {sorted(WORKLOADS)}") from None
