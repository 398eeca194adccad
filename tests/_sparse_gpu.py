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


def assert_nan_selected_vs_pruned(cfgs, n):
    """A NaN byte of b reaches c iff the metadata selects its position (also times a zero value): four hand-made
    rows of A over b [n, 256] with one NaN byte at row 5, K-column 1, run with each config of ``cfgs`` into a
    NaN-poisoned output; the NaN tile is recomputed from the selected positions, the other tiles stay on the fast
    path (every other element the hand-computed value)."""
    M, k = 200, 256
    b = np.tile(np.array([0x38, 0x40, 0x48, 0x50], np.uint8), (n, k // 4))  # 1, 2, 4, 8
    b[5, 1] = 0x7F  # NaN at group 0, position 1 of row n = 5
    vals = np.zeros((M, k // 4), np.uint8)
    meta = np.full((M, k // 4), 0x08, np.uint8)
    vals[:4, 0] = [0x21, 0x21, 0x00, 0x21]
    meta[:4, 0] = [0x0D, 0x0E, 0x04, 0x08]  # selects {1,3}, {2,3}, {0,1} (values 0), {0,2}
    vals[:, 63] = 0x22  # 1.0 and 1.0 at positions 0 and 2 of the last group: + (1 + 4)
    for cfg in cfgs:
        c = run_poisoned(vals, meta, b, cfg).float().numpy()
        rest = 5.0
        assert np.isnan(c[0, 5]) and np.isnan(c[2, 5])
        assert c[1, 5] == 0.5 * 4 + 1.0 * 8 + rest and c[3, 5] == 0.5 * 1 + 1.0 * 4 + rest
        assert c[0, 4] == 0.5 * 2 + 1.0 * 8 + rest
        assert np.isnan(c).sum() == 2 and (c[4:] == rest).all()
