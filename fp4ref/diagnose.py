"""Bug fingerprints: when a check fails, classify the error pattern and name the known bug it matches.

:func:`diagnose` looks at a failing output beside its reference (and, where given, the workload's operands) and
returns :class:`Diagnosis` entries, each a known bug with its evidence. Two kinds of test:

* patterns in the output alone: unwritten trailing rows or columns (elements still holding the poison), NaNs the
  kernel computed (with a poison of its own bits, the other NaNs), NaN/inf flushed to finite values, outputs
  rounded toward zero or away from it (the signs of the errors against the correctly rounded value, every wrong
  element one ulp off);
* "the output is what the bug would compute": the output is recomputed, on a sample of at most 4 rows x 48
  columns, the way the bug reads the operands (swapped nibbles, swapped 2:4 metadata fields, a signed shift of
  int8 bytes, missing or misplaced NVFP4 block scales, plain block scales read as a swizzled layout, a dropped K
  tail), quantizes the NVFP4 layer's activation (another recipe, an amax over a tile of rows, none), scales it (a
  global decode scale left out) or accumulates (fp16 / bf16 partial sums, an unpromoted 14-bit fp8 accumulator);
  the bug is named when that matches the output on >= 90% of the sample, more than the correctly rounded
  reference does, and on at least 4 sampled elements where the reference does not (one element of a tiny output
  says little; the share of each is the evidence); an all-zero output is named as such, not as a bug that
  computes zeros. fp16 / bf16 partial sums are recomputed two ways, fused (``acc = round(acc + a*b)``, the exact
  product) and unfused (``acc = round(acc + round(a*b))``, each product rounded first; skipped where every product
  is exact in the format, as in the sparse workload); either names the bug, and the evidence says which matched.

Pure numpy; the workloads are those of :mod:`fp4ref.workloads` (operands as their numpy dicts).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np

from ._interop import to_numpy
from ._validate import global_scale_float32, is_int
from .bounds import _as_out_array, _check_poison, _is_own_dtype_poison, _unwritten_mask, parse_output_rounding
from .gemm import OUTPUT_FORMATS, Reference, _as_e4m3_bytes, _check_2d, round_float64

__all__ = ["Diagnosis", "diagnose", "BUGS"]

#: The bugs :func:`diagnose` can name, with what each means.
BUGS = {
    "unwritten_tail_columns": "the last output columns are never written (a masked-off partial N tile)",
    "unwritten_tail_rows": "the last output rows are never written (a masked-off partial M tile)",
    "unwritten_elements": "output elements are never written (still hold the poison)",
    "zero_output": "every output element is zero where the reference is not (zeros written, or a zeroed buffer "
                   "left unwritten)",
    "computed_nan": "the kernel computes NaN where the exact result is a number (the NaNs do not hold the poison)",
    "unselected_nan_propagated": "a NaN byte of B at a K position the 2:4 metadata does not select reaches the "
                                 "output (a dense product multiplies it by a pruned zero); the workload ignores it",
    "nonfinite_flushed": "NaN / inf results are flushed to finite values",
    "rounded_toward_zero": "the output is rounded toward zero (a truncating store) instead of to nearest even",
    "ties_away_from_zero": "output ties are rounded away from zero instead of to even",
    "rounded_away_from_zero": "the output is rounded away from zero instead of to nearest even",
    "fp16_accumulation": "partial sums are kept in fp16 (low-precision accumulation), with the exact products "
                         "added (fused) or each product rounded to fp16 first (unfused)",
    "bf16_accumulation": "partial sums are kept in bf16 (low-precision accumulation), with the exact products "
                         "added (fused) or each product rounded to bf16 first (unfused)",
    "unpromoted_fp8_accumulation": "the 14-bit fp8 tensor-core accumulator is never promoted to fp32",
    "swapped_nibbles": "the two E2M1 codes of a byte are read in the wrong order (element 0 from bits 7:4)",
    "swapped_meta_fields": "the 2:4 metadata index fields are swapped (idx0 read from bits 3:2); it computes the "
                           "same output as swapped_nibbles, so both are named",
    "signed_shift": "int8 bytes are shifted as signed (v >> 4 sign-extends, no mask)",
    "missing_block_scale": "the NVFP4 block scales of the weight are not applied (read as 1.0)",
    "block_scale_wrong_block": "each NVFP4 block uses the scale of the previous block",
    "dropped_k_tail": "the last K elements (a partial or final K tile) are never accumulated",
    "block_scales_read_swizzled": "the weight's plain row-major block scales are read as if they were in a swizzled "
                                  "scale layout (cuBLAS's 128x4 or the 8x4 one, fp4ref.layouts)",
    "activation_other_recipe": "x is quantized by another NVFP4 recipe's rules (named in the evidence) than the "
                               "workload's",
    "activation_amax_not_global": "x's global amax (so its global scale) is taken over a tile of rows instead of "
                                  "the whole x",
    "activation_not_quantized": "x enters the product unquantized (its own values) instead of NVFP4-quantized",
    "missing_global_scale": "a global decode scale (x's or the weight's, named in the evidence) is left out of the "
                            "epilogue",
    "global_scale_misapplied": "a global decode scale (named in the evidence) is applied twice, or its reciprocal "
                               "(the encode scale) is applied instead",
    "block_scales_read_ue8m0": "the weight's E4M3FN block scale bytes are decoded as UE8M0 exponents (2^(byte - "
                               "127), MX's scales)",
    "duplicate_index_overwrite": "a 2:4 group whose two indices are equal keeps its second value only (it overwrites "
                                 "the first) instead of their sum",
    "bf16_rounded_output": "the fp16 output is rounded to bf16 first (8 significant bits) and then stored as fp16",
}

_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
_E4M3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
_MATCH = 0.9  # share of the sample a bug's output must match
_MIN_TELLING = 4  # sampled outputs a bug must explain that the correct reference does not (one element says little)


@dataclass(frozen=True)
class Diagnosis:
    """A known bug the output matches. ``bug`` is a key of :data:`BUGS`; ``evidence`` says what was measured."""

    bug: str
    evidence: str

    @property
    def description(self) -> str:
        return BUGS[self.bug]

    def __str__(self) -> str:
        return f"{self.bug} ({self.evidence})"


def _fmt(ref):
    return OUTPUT_FORMATS[ref.output_format.name]


def _ordered(x64, fmt):
    bits = x64.astype(fmt.dtype).view(np.uint16).astype(np.int64)
    return np.where(bits & 0x8000, -(bits & 0x7FFF), bits)


# ------------------------------------------------------------------------------------------- output patterns


def _unwritten(raw, ref, poison) -> list:
    """Unwritten trailing columns / rows / elements: those holding ``poison`` (any NaN when it is None or a float
    NaN; bit for bit for a scalar of the output dtype, as :func:`fp4ref.bounds.check` reads it)."""
    mask = _unwritten_mask(raw, ref.output_format, np.nan if poison is None else poison, np.isnan(ref.exact),
                           ref.out.astype(np.float64))
    if not mask.any():
        return []
    m2 = mask.reshape(-1, mask.shape[-1])
    rows, cols = m2.shape
    n_col = 0
    while n_col < cols and m2[:, cols - 1 - n_col].all():
        n_col += 1
    n_row = 0
    while n_row < rows and m2[rows - 1 - n_row].all():
        n_row += 1
    total = int(mask.sum())
    if n_col and n_col * rows == total:
        return [Diagnosis("unwritten_tail_columns", f"the last {n_col} of {cols} columns hold the poison in "
                                                    f"every row, nothing else does")]
    if n_row and n_row * cols == total:
        return [Diagnosis("unwritten_tail_rows", f"the last {n_row} of {rows} rows hold the poison, "
                                                 "nothing else does")]
    return [Diagnosis("unwritten_elements", f"{total} of {mask.size} elements hold the poison where the "
                                            "reference is a number")]


def _computed_nan(o, ref, workload, operands, rows) -> list:
    """NaN outputs where the reference is a number, called after the unwritten ones are ruled out with a poison of
    its own bits: the kernel computed them. In the sparse workload, NaNs only in columns whose B row holds a NaN
    byte that the reference ignores (at positions A does not select) name the dense product that reads them."""
    mask = np.isnan(o) & ~np.isnan(ref.exact)
    if not mask.any():
        return []
    m2 = mask.reshape(-1, mask.shape[-1])
    total = int(m2.sum())
    if workload is not None and workload.name.startswith("sparse") and operands is not None:
        b = np.ascontiguousarray(operands["b_fp8"]).view(np.uint8)
        nan_cols = np.any((b & 0x7F) == 0x7F, axis=1)  # E4M3FN NaN: 0x7F / 0xFF
        if m2[:, nan_cols].sum() == total:
            return [Diagnosis("unselected_nan_propagated", f"{total} of {m2.size} elements are NaN where the "
                                                           f"reference is a number, all in columns whose B row holds "
                                                           f"a NaN byte ({int(nan_cols.sum())} of {b.shape[0]} "
                                                           "rows)")]
    return [Diagnosis("computed_nan", f"{total} of {m2.size} elements are NaN where the reference is a number, "
                                      "and none holds the poison's bits")]


def _zero_output(o, ref) -> list:
    """An all-zero output where the reference is not: no recomputation tells which bug left the zeros."""
    r = ref.out.astype(np.float64)
    if np.any(o) or not np.any(r):
        return []
    return [Diagnosis("zero_output", f"all {o.size} outputs are zero, where the correctly rounded reference has "
                                     f"{int(np.count_nonzero(r))} non-zero")]


def _flushed(o, ref) -> list:
    r = ref.out.astype(np.float64)
    nonfinite = ~np.isfinite(r)
    flushed = nonfinite & np.isfinite(o)
    if not flushed.any():
        return []
    i = tuple(int(v) for v in np.argwhere(flushed)[0])
    return [Diagnosis("nonfinite_flushed", f"{int(flushed.sum())} of the {int(nonfinite.sum())} elements whose "
                                           f"reference is NaN/inf are finite, e.g. {i}: out {float(o[i])!r}, "
                                           f"reference {float(r[i])!r}")]


def _rounding(o, ref) -> list:
    fmt = _fmt(ref)
    r = ref.out.astype(np.float64)
    C = np.asarray(ref.exact, dtype=np.float64)
    fin = np.isfinite(o) & np.isfinite(r) & np.isfinite(C)
    wrong = fin & (o != r)
    n = int(wrong.sum())
    if n < 8:  # a handful of 1-ulp differences says nothing about the rounding rule
        return []
    ulps = np.abs(_ordered(o[wrong], fmt) - _ordered(r[wrong], fmt))
    if ulps.max() > 1:
        return []
    c, ow, rw = C[wrong], o[wrong], r[wrong]
    toward = np.abs(ow) < np.abs(c)  # the wrong value lies between 0 and the exact one
    ulp = fmt.ulp(rw)
    tie = np.abs(np.abs(c - rw) - ulp / 2) == 0
    if toward.all():
        return [Diagnosis("rounded_toward_zero", f"all {n} wrong elements are the neighbour toward zero of the "
                                                 "exact value (1 ulp below the correctly rounded one in magnitude)")]
    if (~toward).all() and tie.all():
        return [Diagnosis("ties_away_from_zero", f"all {n} wrong elements are exact ties, rounded away from zero "
                                                 "instead of to even")]
    if (~toward).all():
        return [Diagnosis("rounded_away_from_zero", f"all {n} wrong elements are the neighbour away from zero of "
                                                    "the exact value")]
    return []


# ------------------------------------------------------------------------------ recomputing as the bug would


def _sample(shape2, rng_rows=4, n_cols=48):
    rows, cols = shape2
    r = np.unique(np.linspace(0, rows - 1, min(rows, rng_rows)).astype(int))
    c = np.unique(np.linspace(0, cols - 1, min(cols, n_cols)).astype(int))
    return r, c


def _equal(o, x, faithful, fmt) -> np.ndarray:
    """Where ``o`` equals ``x`` (NaN matches NaN; with ``faithful`` also one ulp apart)."""
    with np.errstate(invalid="ignore"):
        eq = (o == x) | (np.isnan(o) & np.isnan(x))
        if faithful:
            fin = np.isfinite(o) & np.isfinite(x)
            eq |= fin & (np.abs(_ordered(np.where(fin, o, 0), fmt) - _ordered(np.where(fin, x, 0), fmt)) <= 1)
    return eq


def _share_equal(o, x, faithful, fmt) -> float:
    eq = _equal(o, x, faithful, fmt)
    return float(eq.mean()) if eq.size else 0.0


def _sequential(P, fmt_name):
    acc = np.zeros(P.shape[:-1])
    for j in range(P.shape[-1]):
        acc = round_float64(acc + P[..., j], fmt_name)
    return acc


def _accumulation_variants(P, bug, fmt_name, short):
    """The fused form (each exact product added to the low-precision sum) and, where rounding the products to
    ``fmt_name`` changes any of them, the unfused form (each product rounded first, then added and rounded)."""
    out = [(bug, f"fused, exact products added to the {short} sum", lambda: _sequential(P, fmt_name))]
    with np.errstate(all="ignore"):
        Pr = round_float64(P, fmt_name)
    if not np.array_equal(Pr, P, equal_nan=True):  # products exact in the format: both forms compute the same sums
        out.append((bug, f"unfused, each product rounded to {short} before the add",
                    lambda: _sequential(Pr, fmt_name)))
    return out


def _dense_variants(A, B, K):
    """(name, evidence detail, float64 values) for a dense A [m, K] x B [n, K] sample (fp16 GEMM, sparse)."""
    out = [("dropped_k_tail", f"the last {t} K elements dropped", lambda t=t: A[:, :K - t] @ B[:, :K - t].T)
           for t in _tails(K)]
    P = A[:, None, :] * B[None, :, :]
    out += _accumulation_variants(P, "fp16_accumulation", "float16", "fp16")
    out += _accumulation_variants(P, "bf16_accumulation", "bfloat16", "bf16")
    return out


def _sparse_dense(vals, meta, swap_nibbles=False, swap_meta=False, signed_shift=False, overwrite=False):
    v = vals.view(np.uint8).astype(np.int64)
    t = meta.view(np.uint8).astype(np.int64)
    lo, hi = v & 0xF, v >> 4
    if swap_nibbles:
        lo, hi = hi, lo
    v0, v1 = _E2M1[lo], _E2M1[hi]
    if signed_shift:
        hs = vals.view(np.int8).astype(np.int64) >> 4
        v1 = (1 - 2 * (hs >> 3)) * np.abs(_E2M1[hs & 7])
    i0, i1 = t & 3, (t >> 2) & 3
    if swap_meta:
        i0, i1 = i1, i0
    m, g = v.shape
    A = np.zeros((m, g, 4))
    for j in range(4):
        first = np.where((i0 == j) & ~(overwrite & (i1 == j)), v0, 0.0)  # overwrite: a duplicate index keeps v1
        A[:, :, j] += first + np.where(i1 == j, v1, 0.0)
    return A.reshape(m, 4 * g)


def _candidates(workload, ops, rows, cols):
    """(bug, detail, callable -> float64 values before the output rounding) on the sample."""
    name = workload.name
    if name.startswith("gemm"):
        A = ops["A"][rows].astype(np.float64)
        B = ops["B"][cols].astype(np.float64)
        return _dense_variants(A, B, A.shape[1]) + [
            ("bf16_rounded_output", "", lambda: round_float64(A @ B.T, "bfloat16"))]
    if name.startswith("sparse"):
        vals, meta = ops["a_vals"][rows], ops["a_meta"][rows]
        B = _E4M3[np.asarray(ops["b_fp8"]).view(np.uint8)[cols]]
        with np.errstate(invalid="ignore"):
            out = [(bug, "", lambda kw=kw: _sparse_dense(vals, meta, **kw) @ B.T) for bug, kw in (
                ("swapped_nibbles", {"swap_nibbles": True}), ("swapped_meta_fields", {"swap_meta": True}),
                ("signed_shift", {"signed_shift": True}), ("duplicate_index_overwrite", {"overwrite": True}))]
            A = _sparse_dense(vals, meta)
            out += [v for v in _dense_variants(A, B, A.shape[1]) if v[0] != "bf16_accumulation"]
        from .bounds import simulate

        # the simulator models finite arithmetic (it refuses NaN / inf operands): with a NaN byte of b in the sample
        # the 14-bit accumulator is not recomputed
        if np.isfinite(A).all() and np.isfinite(B).all():
            out.append(("unpromoted_fp8_accumulation", "", lambda: simulate(A, B, "hopper_fp8_wgmma")))
        return out
    if name.startswith("nvfp4"):
        return _nvfp4_candidates(workload, ops, rows, cols)
    return []


def _nvfp4_candidates(workload, ops, rows, cols):
    x = ops["x"]  # checked by _check_operands: bf16 or float32, [..., K], finite; the global scale a float
    amax = ops["x_global_amax"]  # max|x| of the whole x (_check_operands)
    w = np.asarray(ops["weight_fp4"]).view(np.uint8)[cols]
    s = np.asarray(ops["weight_scales"]).view(np.uint8)[cols]
    g = ops["weight_global_decode_scale"]
    xs = x.reshape(-1, x.shape[-1])[rows]
    K = xs.shape[-1]

    def run(xx=xs, ww=w, ss=s):
        ref = workload.reference(x=xx, weight_fp4=ww, weight_scales=ss.view(ml_dtypes.float8_e4m3fn),
                                 weight_global_decode_scale=g, x_global_amax=amax)
        return np.asarray(ref.exact, dtype=np.float64).reshape(len(rows), len(cols))

    out = [("swapped_nibbles", "", lambda: run(ww=((w & 0xF) << 4) | (w >> 4))),
           ("missing_block_scale", "", lambda: run(ss=np.full_like(s, 0x38))),
           ("block_scale_wrong_block", "", lambda: run(ss=np.roll(s, 1, axis=1)))]
    def drop(t):
        xx = xs.copy()  # x's own dtype (bf16 or float32): zeroing the tail changes nothing else
        xx[:, K - t:] = 0
        return run(xx=xx)

    out += [("dropped_k_tail", f"the last {t} K elements dropped", lambda t=t: drop(t)) for t in _tails(K, 16)]
    return out + _nvfp4_scale_layout_candidates(ops, cols, run) + _nvfp4_activation_candidates(ops, rows, cols)


def _nvfp4_scale_layout_candidates(ops, cols, run):
    """The plain [N, K/16] scale bytes read at the byte offsets of a swizzled layout: where that layout of an
    [N, K/16] matrix has no padding (N and K/16 whole tiles), every offset lies inside the plain buffer."""
    from .layouts import blocked_offsets, blocked_size

    s_all = np.asarray(ops["weight_scales"]).view(np.uint8)
    n, nb = s_all.shape
    out = []
    for layout in ("128x4", "8x4"):
        if blocked_size(n, nb, layout) == n * nb:
            bad = s_all.reshape(-1)[blocked_offsets(n, nb, layout)[cols]]
            out.append(("block_scales_read_swizzled", f"the plain scales read as the {layout} layout",
                        lambda bad=bad: run(ss=bad)))
    return out


def _nvfp4_activation_candidates(ops, rows, cols):
    """Bugs in x's quantizer (another recipe, an amax over fewer rows than all of x, none at all) and in the
    epilogue's global scales, each recomputed exactly on the sample (fp4ref.gemm.nvfp4_gemm)."""
    from .blockscale import NVFP4Recipe, NVFP4Tensor, nvfp4_dequantize, nvfp4_quantize
    from .gemm import nvfp4_gemm
    from .packing import unpack_fp4
    from .workloads import NVFP4_X_RECIPE

    x2 = ops["x"].reshape(-1, ops["x"].shape[-1])
    xs, K = x2[rows], x2.shape[-1]
    amax = ops["x_global_amax"]
    w = np.asarray(ops["weight_fp4"]).view(np.uint8)[cols]
    s = np.asarray(ops["weight_scales"]).view(np.uint8)[cols]
    g = np.float32(ops["weight_global_decode_scale"])
    wq = NVFP4Tensor(codes=w, scales=s, global_decode_scale=g, shape=(len(cols), K), recipe="raw", block=(1, 16),
                     axis=1)
    single_level = (NVFP4Recipe.TORCHAO_SINGLE_LEVEL, NVFP4Recipe.TORCHAO_0_16_SINGLE_LEVEL)

    def exact(xq, wt=wq):
        return np.asarray(nvfp4_gemm(xq, wt).exact, dtype=np.float64)

    def quant(recipe, rows_x=xs, a=amax):
        return nvfp4_quantize(rows_x, recipe=recipe, global_amax=None if recipe in single_level else a)

    out = [("activation_other_recipe", f"x quantized with recipe {r.value!r}", lambda r=r: exact(quant(r)))
           for r in NVFP4Recipe if r.value != NVFP4_X_RECIPE]

    # the amax of each sampled row's tile of R rows (a kernel that reduces it per program, per chunk, per row):
    # one candidate per distinct set of amaxes that differs from the global one
    def per_tile(tile_amax):
        return np.concatenate([exact(quant(NVFP4_X_RECIPE, xs[i:i + 1], a)) for i, a in enumerate(tile_amax)])

    seen = set()
    for R in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        if R >= x2.shape[0]:
            break
        starts = (np.asarray(rows) // R) * R
        tile_amax = tuple(float(np.max(np.abs(x2[a:a + R].astype(np.float32)))) for a in starts)
        if tile_amax not in seen and any(a != amax for a in tile_amax):
            seen.add(tile_amax)
            out.append(("activation_amax_not_global", f"x's amax over tiles of {R} row{'s' if R > 1 else ''}",
                        lambda t=tile_amax: per_tile(t)))
    # x's own values times the decoded weight (e2m1 * e4m3 * the fp32 global scale, exact in float64), products
    # and sum in float64: their rounding errors lie far below the output's half ulp, except at rare near-ties
    out.append(("activation_not_quantized", "", lambda: xs.astype(np.float64) @ nvfp4_dequantize(
        wq, dtype=np.float64).T))
    xq = quant(NVFP4_X_RECIPE)
    unit = replace(wq, global_decode_scale=np.float32(1.0))
    out.append(("missing_global_scale", "x's global decode scale left out",
                lambda: exact(replace(xq, global_decode_scale=np.float32(1.0)))))
    out.append(("missing_global_scale", "the weight's global decode scale left out", lambda: exact(xq, unit)))
    for who, gs in (("x's", float(xq.global_decode_scale)), ("the weight's", float(g))):
        if gs != 1.0:  # (a scale of 1 applied twice or inverted changes nothing)
            out.append(("global_scale_misapplied", f"{who} global decode scale applied twice",
                        lambda gs=gs: exact(xq) * gs))
            out.append(("global_scale_misapplied", f"{who} global decode scale's reciprocal applied",
                        lambda gs=gs: exact(xq) / (gs * gs)))
    # the weight's scale bytes read as UE8M0 exponents: e2m1 * 2^(byte - 127) * g, exact in float64 per product
    w_ue8m0 = (_E2M1[unpack_fp4(w)].reshape(len(cols), K // 16, 16) * np.ldexp(1.0, s.astype(np.int64) - 127)[
        ..., None]).reshape(len(cols), K) * float(g)
    out.append(("block_scales_read_ue8m0", "", lambda: nvfp4_dequantize(xq, dtype=np.float64) @ w_ue8m0.T))
    return out


def _tails(K, multiple=1):
    """K-tail lengths a tiled kernel may drop: K mod BLOCK_K, or one whole last tile, for BLOCK_K 16 ... 256."""
    ts = []
    for bk in (16, 32, 64, 128, 256):
        t = K % bk or bk
        if t < K and t % multiple == 0 and t not in ts:
            ts.append(t)
    return ts


def _sample_reference(workload, ops, rows, cols) -> np.ndarray | None:
    """The workload's correctly rounded output on the sample (float64 [len(rows), len(cols)]), recomputed from the
    operands: it must equal ``ref``'s there, or the operands are not ``ref``'s. None for a workload not known here."""
    name = workload.name
    if name.startswith("gemm"):
        sub = workload.reference(A=ops["A"][rows], B=ops["B"][cols])
    elif name.startswith("sparse"):
        sub = workload.reference(a_vals=ops["a_vals"][rows], a_meta=ops["a_meta"][rows], b_fp8=ops["b_fp8"][cols])
    elif name.startswith("nvfp4"):
        x = ops["x"].reshape(-1, ops["x"].shape[-1])[rows]
        sub = workload.reference(x=x, weight_fp4=ops["weight_fp4"][cols],
                                 weight_scales=ops["weight_scales"][cols].view(ml_dtypes.float8_e4m3fn),
                                 weight_global_decode_scale=ops["weight_global_decode_scale"],
                                 x_global_amax=ops["x_global_amax"])
    else:
        return None
    return sub.out.astype(np.float64).reshape(len(rows), len(cols))


def _recomputed(out2, ref, workload, ops, rows_checked, output_rounding) -> tuple:
    """(the bugs whose recomputation matches the sample best, that share), ([], 0.0) when none does."""
    fmt = _fmt(ref)
    faithful = output_rounding == "faithful"
    o2 = out2
    r2 = ref.out.astype(np.float64).reshape(o2.shape)
    rows, cols = _sample(o2.shape)
    src_rows = rows if rows_checked is None else np.asarray(rows_checked)[rows]
    # the operands must be ref's: recomputed on the sample, the correct output is ref's there, bit for bit
    again = _sample_reference(workload, ops, src_rows, cols)
    if again is not None:
        want = r2[np.ix_(rows, cols)]
        same = (again == want) | (np.isnan(again) & np.isnan(want))
        if not same.all():
            raise ValueError(f"operands do not reproduce ref: on {int((~same).sum())} of {same.size} sampled "
                             "elements the output recomputed from them differs from ref.out (operands swapped or "
                             "of other data, or rows= that are not the rows ref was computed on)")
    o = o2[np.ix_(rows, cols)]
    want_s = r2[np.ix_(rows, cols)]
    base = _share_equal(o, want_s, faithful, fmt)
    found = []
    for bug, detail, fn in _candidates(workload, ops, src_rows, cols):
        # No exception is swallowed here: _check_operands has checked every operand's dtype and shape against the
        # reference (and rows against both), which is all a candidate needs to apply, so each one computes; an
        # error here is a mistake (in the operands or in fp4ref) that must surface, never a silent "no known bug".
        with np.errstate(all="ignore"):
            x = round_float64(np.asarray(fn(), dtype=np.float64), fmt.name)
        share = _share_equal(o, x, faithful, fmt)
        # evidence: sampled outputs the bug's recomputation explains and the correct reference does not
        telling = int(np.sum(_equal(o, x, faithful, fmt) & ~_equal(o, want_s, faithful, fmt)))
        if share >= _MATCH and share > base and telling >= _MIN_TELLING:
            found.append((share, bug, detail))
    if not found:
        return [], 0.0
    top = max(share for share, _, _ in found)
    # bugs that compute the same output are all named (swapping the two nibbles of a byte and swapping the two
    # index fields of its meta byte put the same values in the same columns); a bug recomputed several ways (the
    # fused and unfused accumulation, K tails) is named once, with each way that matches best
    best = {}
    for share, bug, detail in found:
        if share == top:
            best.setdefault(bug, [])
            if detail:
                best[bug].append(detail)
    return [Diagnosis(bug, f"{' or '.join(details) + ': ' if details else ''}recomputed that way, "
                           f"{100 * top:.0f}% of {o.size} sampled outputs match (the correctly rounded reference: "
                           f"{100 * base:.0f}%)") for bug, details in best.items()], top


def _resolve_workload(workload):
    """The Workload diagnose's ``workload`` argument names, or a TypeError / ValueError naming the argument."""
    from .workloads import WORKLOADS, Workload

    if isinstance(workload, str):
        if workload not in WORKLOADS:
            raise ValueError(f"workload={workload!r} is not a known workload; expected one of {sorted(WORKLOADS)}")
        return WORKLOADS[workload]
    if not isinstance(workload, Workload):
        raise TypeError(f"workload={workload!r}: expected a fp4ref.workloads.Workload or its name, got "
                        f"{type(workload).__name__}")
    return workload


def _array(v, name):
    """``v`` (a numpy array, or a torch tensor read as the numpy array of its bits), or a TypeError naming it."""
    v = to_numpy(v, name)
    if not isinstance(v, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array or a torch tensor, got {type(v).__name__}")
    return v


def _fit(arr, name, want, layout, what):
    """A ValueError naming ``name`` unless ``arr.shape`` is ``want`` (None: any length there, shown as M)."""
    if len(arr.shape) != len(want) or any(w is not None and w != s for w, s in zip(want, arr.shape)):
        shown = "(" + ", ".join("M" if w is None else str(w) for w in want) + ("," if len(want) == 1 else "") + ")"
        raise ValueError(f"{name} has shape {arr.shape}; expected {shown} ({layout} {what})")


def _gemm_operands(ops, M, N, K, what):
    A = _check_2d(_array(ops["A"], "operands['A']"), "operands['A']", ("float16",))
    B = _check_2d(_array(ops["B"], "operands['B']"), "operands['B']", ("float16",))
    _fit(A, "operands['A']", (M, K), "[M, K]", what)
    _fit(B, "operands['B']", (N, K), "[N, K]", what)
    return {"A": A, "B": B}, A.shape[0]


def _sparse_operands(ops, M, N, K, what):
    out = {}
    for a in ("a_vals", "a_meta"):
        v = _array(ops[a], f"operands[{a!r}]")
        if v.dtype not in (np.uint8, np.int8):
            raise TypeError(f"operands[{a!r}] must be uint8 or int8 (raw bytes), got dtype {v.dtype}")
        _fit(v, f"operands[{a!r}]", (M, K // 4), "[M, K/4]", what)
        out[a] = v
    b = _as_e4m3_bytes(_array(ops["b_fp8"], "operands['b_fp8']"), "operands['b_fp8']")
    _fit(b, "operands['b_fp8']", (N, K), "[N, K]", what)
    out["b_fp8"] = b
    return out, out["a_vals"].shape[0]


def _nvfp4_operands(ops, N, K, what, xwant):
    x = _array(ops["x"], "operands['x']")
    if x.dtype.name not in ("bfloat16", "float32"):
        raise TypeError(f"operands['x'] must be bfloat16 (ml_dtypes) or float32, got dtype {x.dtype}")
    _fit(x, "operands['x']", xwant, "[..., M, K]", what)
    # the amax of the whole x, with which the sampled rows are quantized (as the reference's rows were); NaN / inf
    # when x holds one: then there is no reference (the workload's quantizer refuses such x)
    amax = float(np.max(np.abs(x.astype(np.float32)))) if x.size else 0.0
    if not np.isfinite(amax):
        raise ValueError("operands['x'] holds NaN/inf: the workload quantizes x, and has no reference output then")
    wc = _array(ops["weight_fp4"], "operands['weight_fp4']")
    if wc.dtype not in (np.uint8, np.int8):
        raise TypeError(f"operands['weight_fp4'] must be uint8 packed E2M1 codes, got dtype {wc.dtype}")
    _fit(wc, "operands['weight_fp4']", (N, K // 2), "[N, K/2]", what)
    ws = _as_e4m3_bytes(_array(ops["weight_scales"], "operands['weight_scales']"), "operands['weight_scales']")
    _fit(ws, "operands['weight_scales']", (N, K // 16), "[N, K/16]", what)
    # a one-element array or tensor (compressed-tensors stores it with shape [1]) is its element, as NVFP4Tensor's
    g = global_scale_float32(to_numpy(ops["weight_global_decode_scale"], "operands['weight_global_decode_scale']"),
                             "operands['weight_global_decode_scale']")
    ops = {"x": x, "weight_fp4": wc.view(np.uint8), "weight_scales": ws, "weight_global_decode_scale": g}
    return {**ops, "x_global_amax": amax}, int(np.prod(x.shape[:-1]))


def _check_operands(workload, operands, ref, subset):
    """(``operands`` for ``workload`` as numpy arrays, the number of rows they hold), or a TypeError / ValueError
    naming the argument: each operand's dtype, and its shape against the reference's M, N and K (``subset``: rows
    given, the operands are the whole input and their M is free)."""
    if not isinstance(operands, Mapping):
        raise TypeError(f"operands: expected a mapping from the workload's argument names {list(workload.args)} to "
                        f"arrays, got {type(operands).__name__}")
    missing = [a for a in workload.args if a not in operands]
    if missing:
        raise ValueError(f"operands lacks {missing} of {workload.name}'s arguments {list(workload.args)}")
    extra = [a for a in operands if a not in workload.args]
    if extra:  # a misspelt or another workload's operand would be silently ignored
        raise ValueError(f"operands has {extra}, which are not {workload.name}'s arguments {list(workload.args)}")
    shape = ref.out.shape
    N, K = shape[-1], int(ref.K)
    M = None if subset else int(np.prod(shape[:-1]))
    what = (f"for the reference's output {shape}, K = {K}" +
            ("; with rows, M is the whole input's, any" if subset else ""))
    name = workload.name
    if name.startswith("gemm"):
        return _gemm_operands(operands, M, N, K, what)
    if name.startswith("sparse"):
        return _sparse_operands(operands, M, N, K, what)
    if name.startswith("nvfp4"):
        # x is [..., M, K] (the workload's [1, M, K]); the rows are those of x.reshape(-1, K)
        return _nvfp4_operands(operands, N, K, what, tuple(shape[:-2]) + (M, K) if subset else shape[:-1] + (K,))
    return dict(operands), None  # a workload diagnose recomputes nothing for: its operands are never read


def _check_rows(rows, ref, m_ops):
    """``rows`` as an int64 array, or a TypeError / ValueError naming it: integer indices, one per output row (of
    ``ref.out`` flattened to [rows, N]), each in [0, ``m_ops``) (the operands' rows; None: no upper bound)."""
    want = "a 1-D sequence or array of integer row indices"
    if isinstance(rows, (list, tuple, range)):
        bad = [v for v in rows if not is_int(v)]
        if bad:  # 0.0, True, "0", None: never read as an index
            raise TypeError(f"rows: expected {want}, got an element {bad[0]!r} ({type(bad[0]).__name__})")
        arr = np.array([int(v) for v in rows], dtype=object if rows else np.int64)  # no int64 wrap-around
    else:
        arr = to_numpy(rows, "rows")
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"rows: expected {want}, got {type(rows).__name__}")
        if arr.dtype.kind not in "iu":  # bool (a mask), float: not indices
            raise TypeError(f"rows: expected {want}, got an array of dtype {arr.dtype}")
        if arr.ndim != 1:
            raise ValueError(f"rows: expected {want}, got an array of shape {arr.shape}")
    n_out = int(np.prod(ref.out.shape[:-1]))
    if arr.size != n_out:
        raise ValueError(f"rows has {arr.size} entries; expected one per output row: {n_out} (out and the "
                         f"reference have shape {ref.out.shape})")
    hi = 2**63 if m_ops is None else m_ops  # no operands: rows is not read, but still an index (int64)
    outside = np.array([v < 0 or v >= hi for v in arr.tolist()], dtype=bool)
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        where = "[0, 2**63)" if m_ops is None else f"[0, {m_ops}) (the operands hold M = {m_ops} rows)"
        neg = "; negative indices are not read from the end" if int(arr[i]) < 0 else ""
        raise ValueError(f"rows holds {int(outside.sum())} index(es) outside {where}, the first rows[{i}] = "
                         f"{int(arr[i])}{neg}")
    return arr.astype(np.int64)


def diagnose(out, ref, *, workload=None, operands=None, rows=None, output_rounding: str = "rne",
             poison=None) -> list:
    """Name the known bugs a failing output matches, with evidence (see the module docstring).

    Args:
        out: the kernel output, a numpy array or torch tensor of ``ref.out``'s shape and dtype (float16 or
            ml_dtypes / torch bfloat16: the workload's output dtype; as :func:`fp4ref.bounds.check` requires).
        ref: the :class:`fp4ref.gemm.Reference` it failed against.
        workload: the :class:`fp4ref.workloads.Workload` or its name (``fp4ref.workloads.get_workload``), or None:
            output patterns only.
        operands: the workload's operands, a mapping from each name in ``workload.args`` (e.g. ``"A"``, ``"B"``)
            to its numpy array or torch tensor (read as the numpy array of its bits): the whole input, before any
            row subset. With ``ref.out`` [M, N] (the NVFP4 workload's [1, M, N]) and ``ref.K``: gemm ``A`` float16
            [M, K], ``B`` float16 [N, K]; sparse ``a_vals`` / ``a_meta`` uint8 or int8 [M, K/4], ``b_fp8``
            uint8, int8 or ml_dtypes.float8_e4m3fn [N, K]; NVFP4 ``x`` bfloat16 (ml_dtypes) or float32 [1, M, K],
            finite, ``weight_fp4`` uint8 or int8 [N, K/2], ``weight_scales`` uint8, int8 or float8_e4m3fn
            [N, K/16], ``weight_global_decode_scale`` a real scalar, a 0-d array or tensor, or one of shape (1,)
            (compressed-tensors' layout: its element), finite and > 0 as float32. With ``rows`` the operands' M is
            the whole input's (any). A key that is not one of the workload's arguments is a ValueError (a typo
            would otherwise leave an operand out). The operands are checked before anything is
            recomputed, so a recomputation never fails on them (nor is a failure read as "no known bug").
        rows: when ``ref`` was computed on a row subset of the operands (``workload.slice_rows``, as
            ``fp4ref verify`` does at large M), the rows it covers: one integer index per row of ``ref.out`` (M of
            them for [M, N], and for the NVFP4 workload's [1, M, N]), each in [0, the operands' M) (negative
            indices are refused, not read from the end); ``out`` is then the kernel's output at those rows, the
            shape of ``ref.out``. A list, tuple or range of ints, or a 1-D integer numpy array or torch tensor.
            None (default): ``ref`` covers every row of the operands.
        output_rounding: "rne" or "faithful", as checked.
        poison: what the output buffer held before the kernel ran, as :func:`fp4ref.bounds.check` takes it. None
            or a float NaN: any NaN where the reference is a number counts as unwritten. A NaN of the output's
            own dtype with its own payload (``fp4ref.verify.POISON_BITS``, what ``fp4ref verify`` fills with):
            only those bits count as unwritten, and other NaNs are named as computed (``computed_nan``, or
            ``unselected_nan_propagated`` for the sparse workload's B NaNs that the reference ignores).

    Returns:
        A list of :class:`Diagnosis`, most specific first; empty when nothing known matches.

    Raises:
        TypeError: ``ref`` not a Reference; ``out`` neither a numpy array nor a torch tensor, or not of the
            reference's output dtype (an int, bool or float32 output is refused, never cast); ``workload``
            neither a Workload nor a name; ``operands`` not a mapping; an operand (named, e.g.
            ``operands['A']``) neither a numpy array nor a torch tensor (a scalar only for
            ``weight_global_decode_scale``), or of another dtype than above (nothing is cast); a global decode
            scale of more than one element; ``rows`` not a 1-D sequence or array of integers (a float, a bool, a
            boolean mask).
        ValueError: ``out`` and ``ref.out`` differ in shape; ``output_rounding`` is not "rne" or "faithful";
            an unknown workload name (the message lists the known ones; checked before whether ``operands`` came
            with it); a workload whose output dtype (``workload.output_dtype``) is not the reference's (``ref`` is
            another workload's); only one of ``workload`` and ``operands`` is given; ``operands`` lacking one of the
            workload's arguments; an operand whose shape does not fit the reference's M, N and K (the message
            names it and the shape expected); an NVFP4 ``x`` holding NaN/inf (no reference exists for it); a global
            decode scale that is not finite and > 0 as float32; operands that do not reproduce ``ref`` (the
            correct output recomputed from them on the sample differs from ``ref.out``: operands swapped or of
            other data, or ``rows`` that are not ref's); ``rows`` not 1-D, not one index per row of
            ``ref.out``, or holding an index outside [0, the operands' M) (checked without operands too, where
            the bound is 2**63).
    """
    if not isinstance(ref, Reference):
        raise TypeError(f"ref: expected the fp4ref.gemm.Reference the output failed against, got "
                        f"{type(ref).__name__}")
    # bounds.check's rule: a numpy array or torch tensor of the reference's output dtype (nothing cast: an int,
    # bool or float32 output is a different kernel's, or a mistake)
    raw = _as_out_array(out, _fmt(ref))
    if raw.shape != ref.out.shape:
        raise ValueError(f"out has shape {raw.shape}, the reference {ref.out.shape}")
    _check_poison(poison, ref.output_format)
    o = raw.astype(np.float64)  # exact: every float16 / bfloat16 value is a float64
    output_rounding = parse_output_rounding(output_rounding)
    if workload is not None:  # an unknown name is named first, whether or not operands came with it
        workload = _resolve_workload(workload)
        if workload.output_dtype != ref.output_format.name:  # another workload's reference: never "no known bug"
            raise ValueError(f"workload={workload.name!r} outputs {workload.output_dtype}, but ref's output is "
                             f"{ref.output_format.name}: ref is not a reference of this workload")
    if (workload is None) != (operands is None):
        raise ValueError("workload and operands go together: pass both (recompute the bugs) or neither")
    m_ops = None
    if workload is not None:
        operands, m_ops = _check_operands(workload, operands, ref, rows is not None)
    if rows is not None:
        rows = _check_rows(rows, ref, m_ops)
    found = _unwritten(raw, ref, poison)
    if found:
        return found
    if _is_own_dtype_poison(poison, ref.output_format) and np.isnan(poison):  # no NaN left is the poison's
        found = _computed_nan(o, ref, workload, operands, rows)
        if found:
            return found
    # flushed non-finite elements are named, and the finite ones still analysed: a truncating store also turns an
    # overflow into the largest finite value, and both names describe such a kernel
    flushed = _flushed(o, ref)
    zero = _zero_output(o, ref)
    if zero:
        return flushed + zero
    found, top = [], 0.0
    if workload is not None and operands is not None:
        found, top = _recomputed(o.reshape(-1, o.shape[-1]), ref, workload, operands, rows, output_rounding)
    rounding = _rounding(o, ref) if output_rounding == "rne" else []
    # an unpromoted RZ accumulator's errors also point toward zero, and a truncating store matches its recomputation
    # on most of a sample: the output pattern, which holds for every wrong element, wins over a recomputation that
    # explains only most of the sample; where both explain everything, both are named
    if rounding and top < 1.0:
        found = rounding
    elif rounding:
        found = found + rounding
    return flushed + found
