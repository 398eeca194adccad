"""GPU helpers shared by the Gluon path tests of fp4ref.kernels.sparse_gemm_fp4_fp8: operand bytes, a run into
NaN-poisoned buffers, and the check against fp4ref's exact reference."""
from __future__ import annotations

import numpy as np
import torch

from fp4ref.bounds import check
from fp4ref.gemm import sparse_gemm_fp4_fp8 as reference
from fp4ref.kernels import _runtime
from fp4ref.kernels import sparse_gemm_fp4_fp8 as mod

NAN = float("nan")


def b_bytes(rng, n, k, nan_rate=0.0):
    """Random finite E4M3FN bytes [n, k], optionally NaN bytes (0x7F / 0xFF) at rate ``nan_rate``."""
    b = rng.integers(0, 256, (n, k), dtype=np.uint8)
    b[(b & 0x7F) == 0x7F] ^= 0x01
    if nan_rate:
        hit = rng.random((n, k)) < nan_rate
        b[hit] = np.where(rng.random((n, k)) < 0.5, 0x7F, 0xFF).astype(np.uint8)[hit]
    return b


def run_poisoned(vals, meta, b, cfg):
    """The kernel on numpy bytes (uint8 vals, meta [M, K/4]; b [N, K]) with ``cfg``, into a NaN-filled output,
    with the split-K partials (NaN) and the dense-A workspace (E4M3FN NaN bytes) poisoned first; c on the CPU."""
    dev = torch.device("cuda")
    stream = _runtime.current_stream(dev)
    _runtime.workspace(dev, stream, mod.WS_PARTIALS, 1, torch.float32).fill_(NAN)
    _runtime.workspace(dev, stream, mod.WS_DENSE_A, 16, torch.float8_e4m3fn).view(torch.uint8).fill_(0x7F)
    v = torch.from_numpy(np.ascontiguousarray(vals).view(np.int8)).cuda()
    t = torch.from_numpy(np.ascontiguousarray(meta).view(np.int8)).cuda()
    bb = torch.from_numpy(np.ascontiguousarray(b)).cuda().view(torch.float8_e4m3fn)
    out = torch.full((v.shape[0], bb.shape[0]), NAN, dtype=torch.bfloat16, device="cuda")
    assert mod.sparse_gemm_fp4_fp8(v, t, bb, cfg, out=out) is out
    return out.cpu()


def assert_ok(c, vals, meta, b):
    """c within NUMERIC_CONTRACT's model of the exact result (RNE output, NaN-poisoned), and NaN exactly where the
    reference has it; returns the reference."""
    ref = reference(vals, meta, b)
    check(c, ref, mod.NUMERIC_CONTRACT.model, output_rounding="rne", poison=NAN).assert_ok()
    np.testing.assert_array_equal(np.isnan(c.float().numpy()), np.isnan(ref.exact))
    return ref


def check_any_bytes(M, n, k, cfg, nan_rate):
    """Random vals / meta bytes [M, k / 4] and b [n, k] (seeded by the shape), without and then with NaN bytes
    in b at ``nan_rate``: two runs bitwise equal, ``assert_ok``, and the NaN case really has NaN in some but not
    all of the reference."""
    rng = np.random.default_rng(M * 7 + n)
    vals = rng.integers(0, 256, (M, k // 4), dtype=np.uint8)
    meta = rng.integers(0, 256, (M, k // 4), dtype=np.uint8)
    for rate in (0.0, nan_rate):
        b = b_bytes(rng, n, k, rate)
        c1 = run_poisoned(vals, meta, b, cfg)
        c2 = run_poisoned(vals, meta, b, cfg)
        assert torch.equal(c1.view(torch.int16), c2.view(torch.int16))  # bitwise, run to run
        ref = assert_ok(c1, vals, meta, b)
        if rate:
            assert np.isnan(ref.exact).any() and not np.isnan(ref.exact).all()


def random_operands(seed, M, n, k):
    """Random (vals, meta, b) bytes [M, k / 4], [M, k / 4], [n, k] as numpy uint8 and as the kernel's CUDA
    tensors (int8, int8, float8_e4m3fn)."""
    rng = np.random.default_rng(seed)
    vals = rng.integers(0, 256, (M, k // 4), dtype=np.uint8)
    meta = rng.integers(0, 256, (M, k // 4), dtype=np.uint8)
    b = b_bytes(rng, n, k)
    cuda = (torch.from_numpy(vals.view(np.int8)).cuda(), torch.from_numpy(meta.view(np.int8)).cuda(),
            torch.from_numpy(b).cuda().view(torch.float8_e4m3fn))
    return (vals, meta, b), cuda
