"""fp16 GEMM C = A @ B.T for the gemm_n3072_k2048 workload (Llama-3.2-1B fused qkv_proj), tuned for the H200.

Workload (FlashInfer-Bench ``gemm_n3072_k2048``): A float16 [M, 2048], B float16 [3072, 2048], C float16
[M, 3072], 43 values of M from 1 to 8192. Peer: torch.matmul (cuBLAS).

Paths, picked per M by ``CONFIGS`` (configs.py; a documented table, no autotuning at start-up):

* ``GluonConfig`` -> ``gluon.gemm_swapab_kernel`` (M = 3-256 on a GPU): Gluon swap-AB wgmma (N on the wgmma M
  side), TMA / mbarrier ring; sm_90 only.
* ``SplitKConfig`` -> ``splitk.gemm_fp16_splitk_kernel`` (M <= 256 in the CPU interpreter, which cannot run
  Gluon): pointer loads, one program per (C tile, K slice), deterministic last-arrival split-K reduction.
* ``PersistentConfig`` -> ``persistent.gemm_persistent_kernel`` (on a GPU M = 257-1024: 128 x 192 whole tiles;
  1409-2112 and above 4096: 192 x 128 whole tiles in two row parts): Gluon, persistent and warp-specialized,
  optional deterministic stream-K; sm_90 only.
* ``TmaConfig`` -> ``tma.gemm_fp16_tma_kernel`` (persistent, TMA) or, with ``STREAM_K``,
  ``tma.gemm_fp16_tma_streamk_kernel`` (the other M > 256, 1025-1408 and 2113-4096 on a GPU: 128 x 256 tiles,
  whole-tile mode STREAM_K=3).
* ``GemvConfig`` -> ``gemv.gemm_fp16_gemv_kernel`` (M = 1-2 on a GPU; any device): CUDA cores, many small
  programs each streaming a few rows of B over the whole K; fp32 sums, no split-K.

``gemm_tma(A, B, C, scale=None, config=None)`` is the TMA path for other callers: fp16 or bf16 operands, an
optional fp32 epilogue scale read from device memory; default configs in ``TMA_CONFIGS``.

Numeric contract (``NUMERIC_CONTRACT``; ``accumulation_model(config, K)`` per config): products exact, fp32
accumulation on the tensor cores, split-K / stream-K partials summed in a fixed order in fp32, ONE RNE rounding
to fp16. Bitwise deterministic. docs/kernels.md, "gemm_fp16".

Host side (kernels/_runtime.py): a launch plan per (dtypes, shapes, strides, devices, config) holds the
``_runtime.Launch``; split-K and stream-K scratch comes from ``_runtime.workspace`` per (device, stream), under
the names ``PARTIALS`` (fp32 partial tiles) and ``COUNTERS`` (int32 arrival counters, 0 between launches).
``pick_config`` reads ``configs.CONFIGS`` and gemm_tma ``configs.TMA_CONFIGS`` at a key's first call: after
replacing either (module attributes of configs.py), call ``_runtime.clear_plans()``.
"""
from __future__ import annotations

import torch

from .. import _runtime
from . import configs as _configs
from .._runtime import Desc, Launch, PlanCache
from .configs import (CONFIGS, INTERPRETER_CONFIGS, NUMERIC_CONTRACT, TMA_CONFIGS, GemvConfig, GluonConfig,
                      PersistentConfig, SplitKConfig, TmaConfig, accumulation_model, launch_programs, pick_config,
                      stream_k_schedule)  # fmt: skip
from .gemv import gemm_fp16_gemv_kernel, gemv_constexprs
from .gluon import gemm_swapab_kernel, gluon_constexprs, operand_layouts
from .persistent import gemm_persistent_kernel, persistent_constexprs, persistent_layouts
from .splitk import gemm_fp16_splitk_kernel, splitk_constexprs
from .tma import tma_constexprs, tma_kernel

__all__ = [
    "ALIGN", "CONFIGS", "COUNTERS", "GemvConfig", "GluonConfig", "INTERPRETER_CONFIGS", "NUMERIC_CONTRACT", "PARTIALS",
    "PersistentConfig", "SplitKConfig", "TMA_CONFIGS", "TmaConfig",
    "accumulation_model", "gemm_fp16", "gemm_tma", "launch_programs", "pick_config", "stream_k_schedule",
]

ALIGN = 8  # elements: N and K must be multiples of 8 (16-byte fp16 rows for TMA and vector loads)
PARTIALS = "gemm_fp16.partials"  # workspace name: fp32 partial tiles of split tiles
COUNTERS = "gemm_fp16.counters"  # workspace name: int32 arrival counter per split tile, 0 between launches
_TMA_DTYPES = (torch.float16, torch.bfloat16)


def gemm_fp16(A: torch.Tensor, B: torch.Tensor,
              config: SplitKConfig | TmaConfig | GluonConfig | PersistentConfig | GemvConfig | None = None,
              out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """C = A @ B.T in fp16 with fp32 accumulation and one RNE rounding to fp16 (see NUMERIC_CONTRACT).

    Args:
        A: torch.float16 [M, K], any M >= 0, unit stride along K, row stride a multiple of 8, 16-byte aligned.
        B: torch.float16 [N, K], N >= 1 and K >= 1 multiples of 8 (ALIGN), same layout rules; same device as A.
        config: a SplitKConfig, TmaConfig, GluonConfig, PersistentConfig (these two CUDA only) or GemvConfig
            (M <= its ``max_m``) overriding the table's choice (tests and tuning); None picks
            ``pick_config(M, N, K)``.
        out: optional preallocated result, torch.float16 [M, N], contiguous, 16-byte aligned, on A's device,
            sharing no memory with A or B (every element is written; tests pass a NaN-poisoned buffer). None
            allocates one.

    Returns:
        torch.float16 [M, N] (``out`` when given), contiguous; bitwise deterministic run to run. M = 0 gives
        [0, N].

    Raises:
        TypeError: A, B or out is not a float16 torch.Tensor; config is not a SplitKConfig, TmaConfig,
            GluonConfig, PersistentConfig or GemvConfig.
        ValueError: not 2-D, K mismatch, N or K not a multiple of 8 or < 1, bad strides/alignment, devices differ,
            ``out`` of the wrong shape/device, not contiguous or overlapping A or B; a GluonConfig for CPU tensors
            or M > 256; a PersistentConfig for CPU tensors; a GemvConfig for M > its ``max_m``.

    Concurrency: split-K and stream-K configs use workspaces per (device, stream); calls on one stream are safe,
    as are calls on different streams.

    Source: workload gemm_n3072_k2048 (FlashInfer-Bench), C = A @ B.T.
    """
    if not isinstance(A, torch.Tensor) or not isinstance(B, torch.Tensor):
        bad = "A" if not isinstance(A, torch.Tensor) else "B"
        raise TypeError(f"{bad}: expected a torch.Tensor, got {type(A if bad == 'A' else B).__name__}")
    if config is not None and not isinstance(config, (SplitKConfig, TmaConfig, GluonConfig, PersistentConfig,
                                                      GemvConfig)):
        raise TypeError(f"config: expected a SplitKConfig, TmaConfig, GluonConfig, PersistentConfig, GemvConfig or "
                        f"None, got {type(config).__name__}")
    key = (A.dtype, B.dtype, A.shape, A.stride(), B.shape, B.stride(), A.device, B.device, config)
    plan = _PLANS.get(key)
    if plan is None:
        _check_operand("A", A, "M")
        _check_operand("B", B, "N")
        M, N, K = _check_pair(A, B, "16-byte fp16 rows")
        if isinstance(config, (GluonConfig, PersistentConfig)) and A.device.type != "cuda":  # at any M, 0 too
            path = "persistent Gluon path" if isinstance(config, PersistentConfig) else "Gluon path"
            raise ValueError(f"config={config}: the {path} runs on CUDA (sm_90), got {A.device}")
        if M > 0:
            plan = _plan(A, B, M, N, K, pick_config(M, N, K) if config is None else config, False)
            _PLANS.put(key, plan)
    else:
        _check_aligned(A, B)
    M, K = A.shape
    N = B.shape[0]
    if out is None:
        C = torch.empty((M, N), dtype=torch.float16, device=A.device)
    else:
        if not isinstance(out, torch.Tensor) or out.dtype != torch.float16:
            raise TypeError(f"out: expected a torch.float16 tensor, got {getattr(out, 'dtype', type(out).__name__)}")
        _check_output("out", out, M, N, A.device)
        _runtime.check_no_overlap(out, "out", A=A, B=B)
        C = out
    if M > 0:
        _run(plan, A, B, C, None)
    return C


def gemm_tma(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, scale: torch.Tensor | None = None,
             config: TmaConfig | None = None) -> torch.Tensor:  # fmt: skip
    """C = round(scale * (A @ B.T)) with the TMA path; fp16 or bf16 operands, fp32 accumulation.

    Numerics: products exact (fp16 and bf16 have <= 11 significant bits); per K slice one fp32 tensor-core chain
    (``accumulation_model(config, K, inputs=A.dtype)``: ``hopper_fp16_wgmma`` / ``hopper_bf16_wgmma``, the same
    model); SPLIT_K > 1 or stream-K: fixed-order fp32 RNE sum of the partials (bitwise deterministic); with
    ``scale``: ONE fp32 multiply acc * scale (RN), then ONE rounding to C's dtype (RNE on the GPU:
    cvt.rn.f16.f32 / cvt.rn.bf16.f32; overflow -> +-inf). Without ``scale`` the path is exactly gemm_fp16's TMA
    path. In the CPU interpreter fp32 -> bf16 truncates (docs/kernels.md): check interpreted bf16 outputs with
    faithful rounding.

    Args:
        A: [M, K] torch.float16 or torch.bfloat16, unit stride along K, row stride a multiple of 8 elements,
            16-byte aligned; any M >= 0.
        B: [N, K], same dtype and layout rules as A, same device; N >= 1 and K >= 1 multiples of 8.
        C: [M, N] preallocated output, torch.float16 or torch.bfloat16 (usually A's dtype), contiguous, 16-byte
            aligned, same device; every element is written.
        scale: None, or a 1-element torch.float32 tensor on A's device (read by the kernel; no host sync, so it
            may be produced by an earlier kernel on the same stream).
        config: a TmaConfig (BLOCK_M a multiple of 64 with num_warps % 4 == 0 for wgmma); None picks
            ``TMA_CONFIGS.pick(M)``. Launch plans are cached per (dtypes, shapes, strides, devices, config, scale
            or not), as for gemm_fp16.

    Returns:
        C.

    Raises:
        TypeError: A, B, C or scale is not a torch.Tensor of an accepted dtype; A and B dtypes differ; config is
            not a TmaConfig.
        ValueError: shapes, strides, alignment or devices as for gemm_fp16; C of the wrong shape/device or not
            contiguous or overlapping A, B or scale; scale not a 1-element tensor on A's device.
    """
    for name, t in (("A", A), ("B", B), ("C", C)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    has_scale = scale is not None
    if has_scale:
        if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
            raise TypeError(f"scale: expected None or a torch.float32 tensor, got "
                            f"{getattr(scale, 'dtype', type(scale).__name__)}")  # fmt: skip
        if scale.numel() != 1 or scale.device != A.device:
            raise ValueError(f"scale: expected 1 element on {A.device}, got shape {tuple(scale.shape)} on "
                             f"{scale.device}")  # fmt: skip
    if config is not None and not isinstance(config, TmaConfig):
        raise TypeError(f"config: expected a TmaConfig or None, got {type(config).__name__}")
    # the scale pointer's 16-byte alignment is part of what Triton specialises on
    key = (A.dtype, B.dtype, C.dtype, A.shape, A.stride(), B.shape, B.stride(), A.device, B.device, config,
           has_scale, has_scale and scale.data_ptr() % 16 == 0)  # fmt: skip
    plan = _TMA_PLANS.get(key)
    if plan is None:
        _check_operand("A", A, "M", _TMA_DTYPES)
        _check_operand("B", B, "N", _TMA_DTYPES)
        if B.dtype != A.dtype:
            raise TypeError(f"A.dtype={A.dtype}, B.dtype={B.dtype}: expected the same dtype")
        if C.dtype not in _TMA_DTYPES:
            raise TypeError(f"C.dtype={C.dtype}: expected torch.float16 or torch.bfloat16")
        M, N, K = _check_pair(A, B, "16-byte rows")
        if M > 0:
            plan = _plan(A, B, M, N, K, _configs.TMA_CONFIGS.pick(M) if config is None else config, has_scale)
            _TMA_PLANS.put(key, plan)
    else:
        _check_aligned(A, B)
    M, K = A.shape
    N = B.shape[0]
    _check_output("C", C, M, N, A.device)
    # (the kernel reads scale after C's first tiles may be stored: it must not lie inside C)
    _runtime.check_no_overlap(C, "C", A=A, B=B, **({"scale": scale} if has_scale else {}))
    if M > 0:
        _run(plan, A, B, C, scale)
    return C


# ---------------------------------------------------------------------------------------------------------------
# Launch plans. The first call of a key (dtypes, shapes, strides, devices, config[, scale]) validates everything,
# picks the config and builds the Launch, whose first launch compiles through Triton's JIT; later calls of the key
# check only what can change between calls (pointer alignment, the output) and launch the kept kernel. The key
# fixes what Triton specialises on (ints 1 or multiples of 16: shapes and strides; M is do_not_specialize; the
# pointers' 16-byte alignment is checked on every call), so the kept kernel is valid for it (kernels/_runtime.py).
# ---------------------------------------------------------------------------------------------------------------
class _Plan:
    """One launch of one key: the path ("splitk", "tma", "gluon", "persistent" or "gemv"), the Launch (holding
    its TMA descriptors' geometry), sizes, row strides and scratch sizes."""

    __slots__ = ("path", "launch", "M", "N", "K", "sa", "sb", "ws_elems", "n_counters")

    def __init__(self, path, launch, M, N, K, sa, sb, ws_elems, n_counters):
        self.path, self.launch, self.M, self.N, self.K, self.sa, self.sb = path, launch, M, N, K, sa, sb
        self.ws_elems, self.n_counters = ws_elems, n_counters


_PLANS = PlanCache("gemm_fp16")
_TMA_PLANS = PlanCache("gemm_fp16.gemm_tma")


def _plan(A, B, M: int, N: int, K: int, config, has_scale: bool) -> _Plan:
    """The launch plan of a validated call (M >= 1) with ``config``."""
    # Row strides: a dimension of size 1 never uses its stride; pass K (a valid row stride) so the kernel's
    # specialization does not depend on an arbitrary value.
    sa = A.stride(0) if M > 1 else K
    sb = B.stride(0) if N > 1 else K
    if isinstance(config, GemvConfig):
        if M > config.max_m:
            raise ValueError(f"config={config}: serves M <= {config.max_m} (max_m), got M={M}")
        launch = Launch(gemm_fp16_gemv_kernel, (-(-N // config.BLOCK_N),), gemv_constexprs(config, M, K),
                        num_warps=config.num_warps)
        return _Plan("gemv", launch, M, N, K, sa, sb, 0, 0)
    BM, BN, BK = config.BLOCK_M, config.BLOCK_N, config.BLOCK_K
    num_tiles = -(-M // BM) * -(-N // BN)
    S = config.SPLIT_K
    split_tiles = num_tiles if S > 1 else 0  # tiles whose partials go through the workspace, S slots each
    if isinstance(config, GluonConfig):  # (CUDA tensors: gemm_fp16 checked)
        if M > 256:
            raise ValueError(f"config={config}: the Gluon path serves M <= 256, got M={M}")
        per, splits = config.k_split(K)
        cluster = config.cluster_size(K)  # > 1: each program is a cluster of the tile's K slices
        tiles = -(-N // BN) * -(-M // BM)
        # swap-AB: B's descriptor first, then A's in its (high, low) row parts
        b_layout, a_layout, a2_layout = operand_layouts(config)
        descs = (Desc((N, K), (sb, 1), (BN, BK), b_layout),
                 *Desc.parts((M, K), (sa, 1), (BM, BK), 0, (a_layout, a2_layout)))
        launch = Launch(gemm_swapab_kernel, (-(-N // BN), splits // cluster, -(-M // BM)),
                        gluon_constexprs(config, K), descs=descs, num_ctas=cluster)  # (num_warps: a constexpr)
        ws = splits > 1 and cluster == 1  # the workspace reduction
        return _Plan("gluon", launch, M, N, K, sa, sb, tiles * splits * BM * BN if ws else 0, tiles if ws else 0)
    if isinstance(config, PersistentConfig):  # (CUDA tensors: gemm_fp16 checked)
        nprog = launch_programs(config, M, N, K, _runtime.num_sms(A.device))
        if config.STREAM_K:  # max-pieces slots per stream-K tile, when any tile is split
            sch = stream_k_schedule(config, M, N, K, nprog)
            S, split_tiles = sch["max_pieces"], sch["sk_tiles"] if sch["split_tiles"] else 0
        # A, B and C in their parts (at most one of BLOCK_M and BLOCK_N has two; C's follow it)
        a_layout, a2_layout, b_layout, b2_layout, c_layout, c2_layout = persistent_layouts(config)
        descs = (*Desc.parts((M, K), (sa, 1), (BM, BK), 0, (a_layout, a2_layout)),
                 *Desc.parts((N, K), (sb, 1), (BN, BK), 0, (b_layout, b2_layout)),
                 *Desc.parts((M, N), (N, 1), (BM, BN), 0 if _runtime.m_parts(BM)[1] else 1, (c_layout, c2_layout)))
        launch = Launch(gemm_persistent_kernel, (nprog,), persistent_constexprs(config), descs=descs)
        return _Plan("persistent", launch, M, N, K, sa, sb, S * split_tiles * BM * BN, split_tiles)
    opts = dict(num_warps=config.num_warps, num_stages=config.num_stages)
    if isinstance(config, SplitKConfig):  # (gemm_tma takes TmaConfigs only: no scale here)
        # (its kernel indexes A, B and the contiguous C with 32-bit offsets)
        _runtime.check_int32_offsets("SplitKConfig path", A=(M - 1) * sa + K, B=(N - 1) * sb + K, out=M * N)
        launch = Launch(gemm_fp16_splitk_kernel, (num_tiles, S), splitk_constexprs(config, K), **opts)
        return _Plan("splitk", launch, M, N, K, sa, sb, S * split_tiles * BM * BN, split_tiles)
    nprog = launch_programs(config, M, N, K, _runtime.num_sms(A.device))
    if config.STREAM_K:  # max-pieces slots per stream-K tile, when any tile is split
        sch = stream_k_schedule(config, M, N, K, nprog)
        S, split_tiles = sch["max_pieces"], sch["sk_tiles"] if sch["split_tiles"] else 0
    descs = (Desc((M, K), (sa, 1), (BM, BK)), Desc((N, K), (sb, 1), (BN, BK)),
             Desc((M, N), (N, 1), (BM, BN // config.EPILOGUE_SUBTILE)))
    launch = Launch(tma_kernel(config), (nprog,), tma_constexprs(config, nprog, has_scale), descs=descs, **opts)
    return _Plan("tma", launch, M, N, K, sa, sb, S * split_tiles * BM * BN, split_tiles)


def _run(plan: _Plan, A, B, C, scale) -> None:
    """Launch ``plan`` on the current stream of A's device (scratch from ``_runtime.workspace``)."""
    device = A.device
    stream = _runtime.current_stream(device)
    ws, cnt = _runtime.split_scratch(device, stream, PARTIALS, plan.ws_elems, COUNTERS, plan.n_counters)
    M, N, K, sa, sb = plan.M, plan.N, plan.K, plan.sa, plan.sb
    if plan.path == "gluon":  # descriptors of B, A and A's low part (the Launch holds their geometry)
        plan.launch.launch(stream, B, A, A, C, ws, cnt, M, N, -(-K // plan.launch.constexprs["BLOCK_K"]), N)
        return
    if plan.path == "persistent":
        plan.launch.launch(stream, A, A, B, B, C, C, ws, cnt, M, N, K)  # (each descriptor in two parts)
        return
    if plan.path == "splitk":
        plan.launch.launch(stream, A, B, C, ws, cnt, M, N, K, sa, sb, N)
        return
    if plan.path == "gemv":
        plan.launch.launch(stream, A, B, C, M, N, K, sa, sb, N)
        return
    plan.launch.launch(stream, A, B, C, ws, cnt, ws if scale is None else scale, M, N, K)


# ---------------------------------------------------------------------------------------------------------------
# Argument checks (ValueError / TypeError naming the argument)
# ---------------------------------------------------------------------------------------------------------------
def _check_operand(name: str, t, dim_name: str, dtypes=(torch.float16,)) -> None:
    if t.dtype not in dtypes:
        raise TypeError(f"{name}.dtype={t.dtype}: expected " + " or ".join(f"torch.{str(d)[6:]}" for d in dtypes))
    if t.dim() != 2:
        raise ValueError(f"{name}.shape={tuple(t.shape)}: expected 2-D [{dim_name}, K]")
    rows, cols = t.shape
    if rows > 0 and cols > 0:
        s0, s1 = t.stride()
        if s1 != 1:
            raise ValueError(f"{name}.stride()={(s0, s1)}: expected unit stride along K (call .contiguous())")
        if rows > 1 and s0 % ALIGN:
            if s0 == cols:  # contiguous: the row length is what is off
                raise ValueError(f"K={cols}: expected a positive multiple of {ALIGN} (16-byte rows)")
            raise ValueError(f"{name}.stride(0)={s0}: expected a multiple of {ALIGN} elements (16 bytes)")
        if t.data_ptr() % 16:
            raise ValueError(f"{name}.data_ptr()={t.data_ptr():#x}: expected 16-byte alignment")


def _check_pair(A, B, rows: str) -> tuple[int, int, int]:
    """(M, N, K) of A [M, K] and B [N, K] after _check_operand: K must match, same device, N and K multiples of
    ALIGN (``rows`` names the reason in the message)."""
    M, K = A.shape
    N, Kb = B.shape
    if Kb != K:
        raise ValueError(f"B.shape={tuple(B.shape)}: expected K={K} columns to match A.shape={tuple(A.shape)}")
    if B.device != A.device:
        raise ValueError(f"A.device={A.device}, B.device={B.device}: expected the same device")
    _runtime.check_device(A, "A")
    if K < 1 or K % ALIGN:
        raise ValueError(f"K={K}: expected a positive multiple of {ALIGN} ({rows})")
    if N < 1 or N % ALIGN:
        raise ValueError(f"N={N}: expected a positive multiple of {ALIGN} ({rows})")
    return M, N, K


def _check_aligned(A, B) -> None:
    """Same shapes, strides, dtypes and devices as a validated call: only pointer alignment can differ."""
    if A.data_ptr() % 16 or B.data_ptr() % 16:
        bad = "A" if A.data_ptr() % 16 else "B"
        raise ValueError(f"{bad}.data_ptr()={(A if bad == 'A' else B).data_ptr():#x}: expected 16-byte alignment")


def _check_output(name: str, C, M: int, N: int, device) -> None:
    if tuple(C.shape) != (M, N) or C.device != device or not C.is_contiguous():
        raise ValueError(f"{name}.shape={tuple(C.shape)} on {C.device} (contiguous={C.is_contiguous()}): expected a "
                         f"contiguous [{M}, {N}] tensor on {device}")  # fmt: skip
    if C.data_ptr() % 16:
        raise ValueError(f"{name}.data_ptr()={C.data_ptr():#x}: expected 16-byte alignment")
