"""GPU checks shared by the nvfp4_linear path tests (Gluon and DP4A): a run into NaN-poisoned output and split-K
partials against fp4ref's exact NVFP4 reference, and the exact-accumulation case."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

import fp4ref.kernels.nvfp4_linear as nvl
from fp4ref import bounds, gemm
from fp4ref.kernels import _runtime
from fp4ref.kernels.nvfp4_linear.tensorcore import PARTIALS_WORKSPACE


def bf16(t) -> np.ndarray:
    """A torch bf16 tensor as a numpy ml_dtypes.bfloat16 array (bits unchanged)."""
    return t.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)


def x_bf16(m: int, k: int, seed: int):
    """(numpy bf16 [m, k], the same on the GPU) from a standard normal."""
    x_np = np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32).astype(ml_dtypes.bfloat16)
    return x_np, torch.from_numpy(x_np.view(np.int16)).view(torch.bfloat16).cuda()


def assert_within_bound_and_deterministic(cfg, x_np, x, wq, wc, ws) -> None:
    """nvfp4_linear with ``cfg`` twice, output, split-K partials and the dequantized-x workspace NaN-poisoned each
    time: bitwise equal, and within the bound of the config's model around fp4ref's exact result (recipe "sol").
    The x poison also fills the workspace rows past M that the Gluon path's x descriptor spans (whole BM-row
    tiles): they must reach no output element."""
    m, n, k = x.shape[0], wc.shape[0], x.shape[1]
    nvl.nvfp4_linear(x, wc, ws, float(wq.global_decode_scale), config=cfg)  # sizes the workspaces
    stream = _runtime.current_stream(x.device)
    outs = []
    for _ in range(2):  # an unwritten or misaddressed element shows as NaN
        _runtime.workspace(x.device, stream, PARTIALS_WORKSPACE, 1, torch.float32).fill_(float("nan"))
        for dtype in (torch.float16, torch.float32):  # the tensor-core and GEMV paths' dequantized x
            _runtime.workspace(x.device, stream, nvl._DEQUANT[dtype], 1, dtype).fill_(float("nan"))
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        nvl.nvfp4_linear(x, wc, ws, float(wq.global_decode_scale), config=cfg, out=out)
        outs.append(out)
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
    ref = gemm.nvfp4_linear(x_np, wq.codes, wq.scales, float(wq.global_decode_scale), recipe="sol")
    bounds.check(bf16(outs[0]), ref, nvl.accumulation_model(cfg, k), output_rounding="rne",
                 poison=float("nan")).assert_ok()


def assert_exact_accumulation_is_correctly_rounded(m: int, seed: int, cfg=None) -> None:
    """Every x block holds a 10.5 (tensor amax 10.5: global encode 256, a power of two; block amax 10.5: block
    scale 448, so x's codes are {0, +-0.5, 6} and dequantized x a multiple of 224), W codes {0, +-0.5, +-1} with
    block scale 1 and global scale 1: every product is a multiple of 16 and every |partial sum| <= K * 2688 <
    2^24 * 16, so the fp32 accumulation (and wgmma's 25-bit alignment) is exact, the epilogue multiplies by a
    power of two exactly, and the output must be the correctly rounded value. ``cfg`` None: the default path."""
    rng = np.random.default_rng(seed)
    K, N = 8192, 1024
    codes = rng.choice(np.array([0, 1, 2, 8, 9, 10], np.uint8), size=(N, K))
    wc = torch.from_numpy((codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)).cuda()
    ws = torch.full((N, K // 16), 0x38, dtype=torch.uint8, device="cuda")  # E4M3 1.0
    xv = rng.choice(np.array([0, 0.5, 1, -0.5, -1], np.float32), size=(m, K))
    xv[:, ::16] = 10.5
    x_np = xv.astype(ml_dtypes.bfloat16)
    out = torch.full((m, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    nvl.nvfp4_linear(torch.from_numpy(x_np.view(np.int16)).view(torch.bfloat16).cuda(), wc, ws, 1.0, out=out,
                     config=cfg)
    ref = gemm.nvfp4_linear(x_np, wc.cpu().numpy(), ws.cpu().numpy(), 1.0, recipe="sol")
    model = nvl.accumulation_model(cfg or nvl.pick_config(m, N, K, interpreter=False), K)
    bounds.check(bf16(out), ref, model, output_rounding="rne", poison=float("nan"),
                 exact_accumulation=True).assert_ok()
