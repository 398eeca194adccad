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
