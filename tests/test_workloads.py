"""Workload plumbing used by `fp4ref verify`: row subsets give exactly the whole input's reference rows."""
import ml_dtypes
import numpy as np
import pytest

from fp4ref import nvfp4_quantize
from fp4ref.verify import _row_subset
from fp4ref.workloads import WORKLOADS


def _nvfp4_ops(rng, m, n, k):
    w = nvfp4_quantize(rng.standard_normal((n, k)).astype(np.float32), recipe="sol")
    x = rng.standard_normal((1, m, k)).astype(np.float32)
    x[0, m - 2, 5] = 300.0  # the tensor amax lives in a row the subset leaves out
    return {"x": x.astype(ml_dtypes.bfloat16), "weight_fp4": w.codes,
            "weight_scales": w.scales.view(ml_dtypes.float8_e4m3fn),
            "weight_global_decode_scale": float(w.global_decode_scale)}


def test_nvfp4_row_subset_uses_whole_tensor_amax():
    w = WORKLOADS["nvfp4_linear_n8192_k8192"]
    ops = _nvfp4_ops(np.random.default_rng(3), 9, 32, 64)
    full = w.reference(**ops)
    rows = np.array([0, 4, 8])
    sub = w.reference(**w.slice_rows(ops, rows))
    assert sub.out.shape == (1, 3, 32)
    np.testing.assert_array_equal(sub.out.view(np.uint16), full.out[:, rows].view(np.uint16))
    # Without the whole tensor's amax the global scale changes and so do the bytes: the subset is not trivial.
    naive = w.reference(**{**ops, "x": ops["x"][:, rows]})
    assert not np.array_equal(naive.out.view(np.uint16), full.out[:, rows].view(np.uint16))


@pytest.mark.parametrize("name", ["gemm_n3072_k2048", "sparse_gemm_fp4_fp8_n2048_k2048"])
def test_dense_row_subsets_match_whole_reference(name):
    w = WORKLOADS[name]
    ops = w.families["public"](np.random.default_rng(1), 6, 16, 64)
    rows = np.array([1, 5])
    full = w.reference(**ops)
    sub = w.reference(**w.slice_rows(ops, rows))
    np.testing.assert_array_equal(sub.out.view(np.uint16), full.out[rows].view(np.uint16))


def test_row_subset_keeps_edges():
    rng = np.random.default_rng(0)
    assert _row_subset(100, 256, rng) is None and _row_subset(5, None, rng) is None
    rows = _row_subset(1000, 256, rng)
    assert rows.size == 256 and np.all(np.diff(rows) > 0)
    assert set(range(64)) <= set(rows.tolist()) and set(range(936, 1000)) <= set(rows.tolist())


def _extreme_sizes():
    """(M, N, K) the gemm workload's extreme family runs at: the CPU defaults, --shapes sweep, the GPU N and K."""
    from fp4ref.verify import _SWEEP_M, sweep_shapes

    w = WORKLOADS["gemm_n3072_k2048"]
    n, k = w.dims(interpreted=True)
    sizes = [(m, n, k) for m in w.cpu_m]
    sizes += [(m, n, k) for m in _SWEEP_M for n, k in sweep_shapes(w)]
    return sizes + [(1, w.n, w.k), (7, w.n, w.k), (3, 16, 1), (4, 30, 3)]


@pytest.mark.parametrize("m,n,k", _extreme_sizes())
def test_gemm_extreme_overflows_at_every_size(m, n, k):
    """docs/verify.md: rows whose exact results overflow fp16 (the reference is inf), subnormal rows,
    near-cancelling columns, at the CPU sizes as at the GPU ones (at (7, 512, 1024) no output overflowed)."""
    w = WORKLOADS["gemm_n3072_k2048"]
    ops = w.families["extreme"](np.random.default_rng(0), m, n, k)
    A, B = ops["A"], ops["B"]
    assert A.dtype == B.dtype == np.float16 and A.shape == (m, k) and B.shape == (n, k)
    assert np.all(np.isfinite(A)) and np.all(np.isfinite(B))
    a, b = A.astype(np.float64), B.astype(np.float64)
    # planted rows: A rows 0, 3, ...; B rows 0, 14, 28, ... and their negated pairs 1, 15, ...
    ra, rb = np.arange(0, m, 3), np.arange(0, n, 14)
    assert np.all(a[ra] > 0) and np.all(b[rb] > 0)
    # every term of those dot products is >= min(A row) * min(B row), so each |sum| > 65520 = 65504 + half an ulp,
    # fp16's overflow threshold (exact: products of fp16 values and their sum bound are exact in float64 here)
    low = a[ra].min(axis=1)[:, None] * b[rb].min(axis=1)[None, :] * k
    assert np.all(low > 65520), low.min()
    ref = w.reference(**ops)
    out = ref.out.astype(np.float64)
    assert np.all(out[np.ix_(ra, rb)] == np.inf)
    pairs = rb[rb + 1 < n] + 1
    assert np.all(out[np.ix_(ra, pairs)] == -np.inf)
    # subnormal rows: A rows 1, 4, ... are randn * 2^-14, within a few multiples of fp16's smallest normal 2^-14
    rs = np.arange(1, m, 3)
    assert np.all(np.abs(a[rs]) < 2.0**-11)
    if rs.size and k >= 56:
        sub = (np.abs(a[rs]) < 2.0**-14) & (a[rs] != 0)
        assert sub.mean() > 0.5
    # near-cancelling column pairs: B row 2j + 1 = fp16(-(1 + 2^-10) b_2j), B row 2j = fp16(b_2j): the ratio is
    # (1 + 2^-10) (1 + d1) / (1 + d0) with |d0|, |d1| <= 2^-11 for normal values
    ev = np.arange(0, n - 1, 2)
    be, bo = b[ev], b[ev + 1]
    normal = np.abs(be) >= 2.0**-14
    ratio = -bo[normal] / be[normal]
    assert np.all(np.abs(ratio - (1 + 2.0**-10)) <= 2.0**-10 + 2.0**-19)


# What each operand family promises (docs/verify.md, "Families"), checked on the drawn values
GEMM_W, SPARSE_W, NVFP4_W = "gemm_n3072_k2048", "sparse_gemm_fp4_fp8_n2048_k2048", "nvfp4_linear_n8192_k8192"


def test_gemm_extreme_subnormal_rows_are_subnormal_scale():
    """Rows 1, 4, ... of the extreme family are randn x 2^-14 (fp16's subnormal boundary): median |x| = 0.674 x
    2^-14."""
    A = WORKLOADS[GEMM_W].families["extreme"](np.random.default_rng(0), 7, 16, 1024)["A"].astype(np.float64)
    assert 2.0**-16 < np.median(np.abs(A[1::3])) < 2.0**-13


def test_sparse_public_bytes_cover_every_int8_value():
    ops = WORKLOADS[SPARSE_W].families["public"](np.random.default_rng(0), 64, 8, 2048)
    for name in ("a_vals", "a_meta"):
        assert ops[name].dtype == np.int8 and np.unique(ops[name]).size == 256, name


def test_sparse_canonical_groups_fill_both_value_slots():
    """Canonical groups hold two values, each a non-zero E2M1 magnitude with probability 14/16: both non-zero in
    about 3/4 x (14/16)^2 = 0.57 of the bytes."""
    ops = WORKLOADS[SPARSE_W].families["canonical"](np.random.default_rng(0), 16, 8, 256)
    v = ops["a_vals"].view(np.uint8)
    assert (((v & 7) != 0) & (((v >> 4) & 7) != 0)).mean() > 0.4


def test_sparse_nan_b_plants_both_e4m3fn_nan_bytes():
    b = WORKLOADS[SPARSE_W].families["nan_b"](np.random.default_rng(0), 1, 128, 2048)["b_fp8"].view(np.uint8)
    assert {0x7F, 0xFF} <= set(np.unique(b).tolist())


def test_nvfp4_adversarial_amax_and_zero_blocks():
    x = WORKLOADS[NVFP4_W].families["adversarial"](np.random.default_rng(0), 2, 32, 256)["x"].astype(np.float32)
    assert np.max(np.abs(x)) == 448.0 * 6  # the "sol" global encode scale is then exactly 1
    assert np.any(np.all(x.reshape(-1, 16) == 0, axis=1))  # all-zero blocks
