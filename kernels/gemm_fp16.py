"""fp16 GEMM C = A @ B.T for the gemm_n3072_k2048 workload (Llama-3.2-1B fused qkv_proj), tuned for the H200.

Workload (/work/shared/facts/seeds.md §3): A float16 [M, 2048], B float16 [3072, 2048], C float16 [M, 3072],
43 values of M from 1 to 8192. Peer: torch.matmul (cuBLAS).

Two kernels, picked per M by CONFIG_TABLE (a documented table, not an autotune at start-up):

* ``gemm_fp16_splitk_kernel`` (small M, memory-bound on B): pointer loads, one program per (C tile, K slice).
  With SPLIT_K > 1 each program writes its fp32 partial tile to a workspace, then increments the tile's arrival
  counter (an atomic with acq_rel semantics); the LAST program to arrive sums the SPLIT_K partials in the fixed
  order s = 0, 1, ..., SPLIT_K-1 in fp32, rounds once to fp16 and resets the counter. Which program arrives last
  varies run to run, but the summation order does not: the output is bitwise deterministic. No program ever waits
  for another, so there is no deadlock whatever order the hardware schedules programs in.
* ``gemm_fp16_tma_kernel`` (large M, compute-bound): tensor descriptors (TMA on sm_90), persistent programs
  walking (K slice, C tile) work units in grouped order; SPLIT_K = 1 in the table (one fp32 chain over all of K),
  SPLIT_K > 1 supported with the same deterministic reduction.
* ``gemm_fp16_tma_streamk_kernel`` (``GemmConfig(..., STREAM_K=1, 2 or 3)``): the same tiles on a grid of one program
  per SM, each program an equal contiguous range of (tile, K-iteration) pairs (1: all tiles; 2: data-parallel
  full waves, stream-K only for the last partial wave; 3: data-parallel only, in a loop Triton flattens over
  (tile, K)), against wave quantization (e.g. 96 or 204 tiles on 132 SMs). A tile cut into several pieces is
  summed in K order (piece 0, 1, ...) by exactly one program (the head piece from registers when the tails are
  in, else the last arrival), with the same counter protocol: bitwise deterministic, no waits.
  ``stream_k_schedule`` mirrors the split points.

Reusable entry point ``gemm_tma(A, B, C, scale=None, config=None)``: the TMA kernel on fp16 or bf16 operands with
an optional fp32 epilogue scale read from device memory (constexpr HAS_SCALE: one fp32 multiply acc * scale, then
ONE rounding to C's dtype); default configs in ``TMA_CONFIGS``. The split-K last-arrival reduction is one jitted
helper (``_splitk_reduce``) used by both kernels.

Host side: a launch plan per (dtypes, shapes, strides, devices, config) keeps the CompiledKernel of the first call
and launches it directly afterwards (Triton's per-call JIT binding costs more CPU time than a small-M kernel runs);
TMA plans also keep the encoded tensor maps per (A, B, C) data pointers (FAST_TMA_LAUNCH).

Numeric contract (NUMERIC_CONTRACT and accumulation_model() below, as fp4ref.bounds model names; read by the
tests and ``fp4ref verify``): products of fp16 values are exact; each K slice is accumulated in fp32 by the tensor
cores (``hopper_fp16_wgmma``: 16 products per step aligned and truncated to 2^(E-25), accumulated with
round-toward-zero; tiles with BLOCK_M < 64 run on mma.sync, bounded by ``tc_fp32_universal``); the SPLIT_K
partials are summed in fp32, round-to-nearest-even, fixed order (``splitk(<model>, L)``); the result is rounded
ONCE to fp16 with RNE (cvt.rn.f16.f32; overflow gives +-inf, as IEEE RNE does).

Alignment (what the kernels need; other shapes raise ValueError): A and B are 2-D CUDA fp16 tensors with unit
stride along K and row strides that are multiples of 8 elements (16 bytes), 16-byte aligned data pointers;
K >= 1 and N >= 1 multiples of 8 (16-byte rows, required by TMA descriptors and the fp16 C rows); any M >= 0
(M = 0 returns an empty [0, N] tensor).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
import triton
import triton.language as tl

from ._launch import hooks_installed, launch_compiled, raw_launcher, tensor_desc

__all__ = [
    "GemmConfig",
    "CONFIG_TABLE",
    "NUMERIC_CONTRACT",
    "ALIGN",
    "TMA_CONFIGS",
    "pick_config",
    "pick_tma_config",
    "accumulation_model",
    "clear_plans",
    "gemm_fp16",
    "gemm_tma",
    "gemm_fp16_splitk_kernel",
    "gemm_fp16_tma_kernel",
    "gemm_fp16_tma_streamk_kernel",
    "stream_k_schedule",
    "launch_programs",
]

ALIGN = 8  # elements: N and K must be multiples of 8 (16-byte fp16 rows for TMA and vector loads)


# ---------------------------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """One launch configuration.

    kernel: "splitk" (gemm_fp16_splitk_kernel, pointer loads) or "tma" (gemm_fp16_tma_kernel, TMA, persistent).
    BLOCK_M/BLOCK_N/BLOCK_K: tile sizes (elements). SPLIT_K: K slices per C tile (1 = no split).
    GROUP_M: tile-order grouping along M (L2 reuse). num_warps/num_stages: Triton launch options.
    PROGRAMS_PER_SM: "tma" only: grid = min(work units, PROGRAMS_PER_SM * SM count); 1 is fully persistent,
    larger values let several programs share an SM (one work unit each when the grid covers all units).
    EPILOGUE_SUBTILE: "tma" only: the C tile is stored as this many [BLOCK_M, BLOCK_N / EPILOGUE_SUBTILE] pieces
    (1 or 2), which shrinks the shared-memory staging buffer of the TMA store (room for one more pipeline stage);
    every element is still rounded once, so the numerics do not depend on it.
    STREAM_K: "tma" with SPLIT_K = 1 only: 0 = the persistent tile kernel; 1 = deterministic stream-K over every
    tile (gemm_fp16_tma_streamk_kernel, grid = PROGRAMS_PER_SM x SMs, each program an equal contiguous range of
    the tiles x K-iterations); 2 = hybrid: the num_tiles // grid full waves data-parallel (whole tiles), stream-K
    only for the num_tiles % grid tiles of the last partial wave (all tiles when num_tiles < grid); 3 = no
    stream-K phase: every tile data-parallel in the stream-K kernel's loop, which Triton flattens over
    (tile, K-iteration) (static K bounds: TMA loads of the next tile run ahead while this one is stored; the
    plain kernel's runtime-bounded K loop is not flattened). Split tiles are summed in K order by exactly one
    program (``stream_k_schedule``, ``accumulation_model``).
    """

    kernel: str
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    SPLIT_K: int = 1
    GROUP_M: int = 8
    num_warps: int = 4
    num_stages: int = 4
    PROGRAMS_PER_SM: int = 1
    EPILOGUE_SUBTILE: int = 1
    STREAM_K: int = 0

    def __post_init__(self):
        if self.kernel not in ("splitk", "tma"):
            raise ValueError(f"kernel={self.kernel!r}: expected 'splitk' or 'tma'")
        if self.EPILOGUE_SUBTILE not in (1, 2) or (self.EPILOGUE_SUBTILE != 1 and self.kernel != "tma"):
            raise ValueError(f"EPILOGUE_SUBTILE={self.EPILOGUE_SUBTILE}: expected 1, or 2 with kernel='tma'")
        if self.STREAM_K not in (0, 1, 2, 3) or (self.STREAM_K and (self.kernel != "tma" or self.SPLIT_K != 1)):
            raise ValueError(f"STREAM_K={self.STREAM_K}: expected 0, or 1/2/3 with kernel='tma' and SPLIT_K=1")
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "GROUP_M", "num_warps", "PROGRAMS_PER_SM"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name}={v}: expected a power of two >= 1")

    @property
    def uses_wgmma(self) -> bool:
        """True when Triton lowers this config's tl.dot to Hopper wgmma (block M multiple of 64, warps % 4 == 0)."""
        return self.BLOCK_M % 64 == 0 and self.num_warps % 4 == 0


# Keyed on M (upper bound inclusive), for N = 3072, K = 2048 on the H200; used for any N, K (correct everywhere,
# tuned only there). Chosen by ``python -m fp4ref.kernels.bench gemm_fp16 --tune`` (2026-11-30, H200): per bucket of
# M, the candidate with the lowest geometric-mean GPU time (L2 flushed, CUDA graphs to exclude launch overhead)
# over the bucket's sample Ms, each candidate first checked (NaN-poisoned output, bound, determinism); a TMA
# config only where it beats the best pointer config by > 3 us at M <= 256 (it costs more host time per call).
# Small M is memory-bound on B (12.6 MB): split-K puts more programs on the SMs; large M uses 128 x 256 TMA tiles
# in the stream-K kernel's whole-tile mode (STREAM_K=3: one flattened (tile, K) loop, so the next tile's loads
# overlap this tile's store; 0-3% faster than the plain persistent kernel in the third tune; the split modes 1/2
# were 30-50% slower there). See docs/kernels.md.
CONFIG_TABLE: tuple[tuple[int, GemmConfig], ...] = (
    (16, GemmConfig("splitk", 16, 32, 128, SPLIT_K=4, num_warps=4, num_stages=4)),
    (32, GemmConfig("splitk", 32, 32, 128, SPLIT_K=4, num_warps=4, num_stages=4)),
    (64, GemmConfig("splitk", 64, 64, 128, SPLIT_K=2, num_warps=4, num_stages=4)),
    (128, GemmConfig("splitk", 128, 64, 128, SPLIT_K=2, num_warps=8, num_stages=4)),
    (192, GemmConfig("splitk", 64, 128, 64, SPLIT_K=1, num_warps=4, num_stages=4)),
    (256, GemmConfig("splitk", 64, 128, 64, SPLIT_K=1, num_warps=4, num_stages=4)),
    (1536, GemmConfig("tma", 128, 256, 64, SPLIT_K=1, num_warps=8, num_stages=4, GROUP_M=4, EPILOGUE_SUBTILE=2,
                      STREAM_K=3)),
    (4096, GemmConfig("tma", 128, 256, 64, SPLIT_K=1, num_warps=8, num_stages=4, GROUP_M=4, EPILOGUE_SUBTILE=2,
                      STREAM_K=3)),
    (2**62, GemmConfig("tma", 128, 256, 64, SPLIT_K=1, num_warps=8, num_stages=3, GROUP_M=4, STREAM_K=3)),
)


def pick_config(M: int, N: int, K: int) -> GemmConfig:
    """The CONFIG_TABLE entry for ``M`` (first row whose bound is >= M). N and K do not change the choice."""
    for bound, cfg in CONFIG_TABLE:
        if M <= bound:
            return cfg
    raise ValueError(f"M={M}: larger than every CONFIG_TABLE bound")  # pragma: no cover - last bound is 2**62


# ---------------------------------------------------------------------------------------------------------------
# Numeric contract (data; fp4ref's checker reads it)
# ---------------------------------------------------------------------------------------------------------------
def stream_k_schedule(cfg: GemmConfig, M: int, N: int, K: int, num_programs: int) -> dict:
    """Host mirror of gemm_fp16_tma_streamk_kernel's split points (same integer arithmetic).

    Returns dict(sk_tiles=tiles in the stream-K phase, dp_tiles=whole tiles of the data-parallel phase,
    max_pieces=most pieces of any one tile, max_piece_len=most products (K elements) in one piece of a split tile
    (K if none),
    split_tiles=stream-K tiles cut into >= 2 pieces, whole_tiles=tiles computed as one chain over all of K,
    pieces={tile: [(program, kt0, kt1), ...] in K order}) for the stream-K tiles.
    """
    if not cfg.STREAM_K:
        raise ValueError(f"config={cfg}: not a stream-K config")
    if min(M, N, K, num_programs) < 1:
        raise ValueError(f"M={M}, N={N}, K={K}, num_programs={num_programs}: expected all >= 1")
    tiles = -(-M // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N)
    k_tiles = -(-K // cfg.BLOCK_K)
    G = num_programs
    sk_tiles = 0 if cfg.STREAM_K == 3 else tiles if cfg.STREAM_K == 1 or tiles <= G else tiles % G
    base, extra = divmod(sk_tiles * k_tiles, G)
    pieces: dict = {}
    for p in range(G):
        it = p * base + min(p, extra)
        end = it + base + (p < extra)
        while it < end:
            t, kt0 = divmod(it, k_tiles)
            kt1 = min(k_tiles, kt0 + end - it)
            pieces.setdefault(t, []).append((p, kt0, kt1))
            it += kt1 - kt0
    lens = [min(k1 * cfg.BLOCK_K, K) - k0 * cfg.BLOCK_K for ps in pieces.values() if len(ps) > 1 for _, k0, k1 in ps]
    split = sum(len(ps) > 1 for ps in pieces.values())
    return dict(sk_tiles=sk_tiles, dp_tiles=tiles - sk_tiles, max_pieces=max((len(ps) for ps in pieces.values()),
                default=1), max_piece_len=max(lens, default=K), split_tiles=split,
                whole_tiles=tiles - split, pieces=pieces)  # fmt: skip


def _dominating_model(inner: str, K: int, BK: int, max_len: int, pieces: int, whole: bool, fallback: str) -> str:
    """The tightest ``splitk(inner, C)`` (C a multiple of BK, or ``inner`` itself for C >= K) whose eps(K)
    bounds every tile of a stream-K launch: a split tile (<= ``pieces`` chains of <= ``max_len`` products, each
    bounded by inner, summed in fp32 RN: eps_in(max_len) + gamma_{pieces-1}(2^-24) (1 + eps_in(max_len)),
    Higham §3.1) and, when ``whole``, an unsplit tile (eps_in(K)). ``fallback`` when none does."""
    from fp4ref.bounds import U32, gamma, get_model

    e_max = get_model(inner).eps(max_len)
    need = e_max + gamma(pieces - 1, U32) * (1 + e_max) if pieces > 1 else e_max
    if whole:
        need = max(need, get_model(inner).eps(K))
    for C in range(-(-max_len // BK) * BK, K, BK):
        name = f"splitk({inner}, {C})"
        if get_model(name).eps(K) >= need:
            return name
    return inner if get_model(inner).eps(K) >= need else fallback


def accumulation_model(cfg: GemmConfig, K: int, interpreter: bool = False, inputs="float16", *, M: int | None = None,
                       N: int | None = None, num_programs: int | None = None) -> str:  # fmt: skip
    """The fp4ref.bounds accumulation model (a name for ``fp4ref.bounds.get_model``) of one config at this K.

    Per K slice of length L = ceil(ceil(K / BLOCK_K) / SPLIT_K) * BLOCK_K (clipped to K):

    * GPU, wgmma tiles (``cfg.uses_wgmma``): ``hopper_fp16_wgmma`` (block FMA, 16 products per step, F = 25,
      fp32 accumulator with RZ; facts/numerics.md "Tensor cores").
    * GPU, tiles with BLOCK_M < 64 (Triton emits mma.sync, not wgmma): ``tc_fp32_universal`` (L * 2^-22, any
      fp32-accumulating tensor core): no bit-accurate model of Hopper's mma.sync path is established here.
    * CPU interpreter (``interpreter=True``): tl.dot is a numpy fp32 product, bounded by ``fp32_rn`` (gamma_L,
      any summation order; Higham 2002 §3.1).

    SPLIT_K > 1 wraps it as ``splitk(<model>, L)``: the partial sums are added in fp32 with RNE in the fixed order
    s = 0, 1, ..., SPLIT_K - 1 (fp4ref.bounds adds gamma_{ceil(K/L)-1}(2^-24)).

    ``inputs``: "float16" (default) or "bfloat16" (a dtype name or torch dtype; gemm_tma's bf16 operands): bf16
    wgmma is named ``hopper_bf16_wgmma``, the same fp4ref.bounds model as fp16 (facts/numerics.md).

    Stream-K configs (cfg.STREAM_K): the pieces depend on M, N and the grid, so pass ``M``, ``N`` and
    ``num_programs`` (the launch grid: PROGRAMS_PER_SM x SMs; ``launch_grid``) to get the tightest
    ``splitk(<model>, C)`` (or ``<model>``) bounding both the split tiles (<= P pieces of <= L products,
    stream_k_schedule) and the whole ones. Without them the answer bounds every schedule: ``fp32_rn`` in the
    interpreter, ``tc_fp32_universal`` on the GPU (K * 2^-22 covers any split of a linear bound plus the sums).
    """
    inputs = str(inputs).replace("torch.", "")
    if inputs not in ("float16", "bfloat16"):
        raise ValueError(f"inputs={inputs!r}: expected 'float16' or 'bfloat16'")
    if K < 1:
        raise ValueError(f"K={K}: expected >= 1")
    k_tiles = -(-K // cfg.BLOCK_K)
    L = min(K, -(-k_tiles // cfg.SPLIT_K) * cfg.BLOCK_K)
    if cfg.STREAM_K:
        inner = "fp32_rn" if interpreter else (
            ("hopper_bf16_wgmma" if inputs == "bfloat16" else "hopper_fp16_wgmma") if cfg.uses_wgmma
            else "tc_fp32_universal")  # fmt: skip
        fallback = "fp32_rn" if interpreter else "tc_fp32_universal"
        if cfg.STREAM_K == 3:  # data-parallel only: one chain over all of K per tile
            return inner
        if M is None or N is None or num_programs is None:
            return fallback
        sch = stream_k_schedule(cfg, M, N, K, num_programs)
        return _dominating_model(inner, K, cfg.BLOCK_K, sch["max_piece_len"], sch["max_pieces"],
                                 sch["whole_tiles"] > 0, fallback)  # fmt: skip
    if interpreter:
        inner = "fp32_rn"
    else:
        wgmma = "hopper_bf16_wgmma" if inputs == "bfloat16" else "hopper_fp16_wgmma"
        inner = wgmma if cfg.uses_wgmma else "tc_fp32_universal"
    return f"splitk({inner}, {L})" if L < K else inner


# Numeric contract (data; read by the tests and by ``fp4ref verify`` through fp4ref.verify.kernel_contract).
NUMERIC_CONTRACT = {
    "inputs": "float16",
    "output": "float16",
    "products": "exact",  # fp16 x fp16 has at most 22 significant bits
    # One model for every config and K, on the GPU and in the interpreter: K * 2^-22 (any fp32-accumulating
    # tensor core; it also covers fp32 RN summation, gamma_K(2^-24) < K * 2^-22, and every split: splitting a
    # linear bound into chunks only lowers it). The tight per-config model is accumulation_model(cfg, K), e.g.
    # "hopper_fp16_wgmma" for the TMA configs and "splitk(tc_fp32_universal, 512)" for M <= 32.
    "accumulation_model": "tc_fp32_universal",
    "accumulation_model_by_config": "fp4ref.kernels.gemm_fp16:accumulation_model",
    "split_k_reduction": "fp32_rn_fixed_order",  # partials summed in fp32 with RNE, s = 0..SPLIT_K-1, always
    "output_rounding": "rne",  # one RNE from the fp32 accumulator to fp16 (cvt.rn.f16.f32; overflow -> +-inf)
    "output_rounding_interpreter": "rne",  # facts/triton.md: fp16 stores round correctly in the CPU interpreter
    "deterministic": True,  # bitwise, run to run (fixed reduction order; no atomics on data)
}


# ---------------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------------
@triton.jit
def _splitk_reduce(acc, ws_ptr, cnt_ptr, tile, pid_k, num_tiles, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   SPLIT_K: tl.constexpr):  # fmt: skip
    """Deterministic split-K reduction shared by both kernels; returns (is_last, total).

    This program's fp32 partial tile ``acc`` (K slice ``pid_k`` of C tile ``tile``) goes to the workspace
    (bypassing L1: another SM reads it), then the tile's arrival counter is incremented (acq_rel atomic). The LAST
    program to arrive gets is_last True and total = the fixed-order fp32 (RNE) sum of the SPLIT_K partials,
    s = 0, 1, ..., SPLIT_K - 1, and resets the counter to 0 for the next launch; the caller stores total. Which
    program arrives last varies run to run, the summation order does not: bitwise deterministic. No program
    waits for another (no deadlock whatever the scheduling order). Other programs get (False, acc), unused.
    """
    tile_elems = BLOCK_M * BLOCK_N
    offs_t = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    ws_tile = ws_ptr + tile.to(tl.int64) * tile_elems
    ws_stride_s = num_tiles.to(tl.int64) * tile_elems
    tl.store(ws_tile + pid_k * ws_stride_s + offs_t, acc, cache_modifier=".cg")
    tl.debug_barrier()  # every thread's partial stores precede the release below
    arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    is_last = arrived == SPLIT_K - 1
    total = acc
    if is_last:
        total = tl.load(ws_tile + offs_t, cache_modifier=".cg")
        for s in tl.static_range(1, SPLIT_K):
            total += tl.load(ws_tile + s * ws_stride_s + offs_t, cache_modifier=".cg")
        tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")  # ready for the next launch
    return is_last, total


@triton.jit(do_not_specialize=["M"])
def gemm_fp16_splitk_kernel(
    # pointers
    a_ptr,  # *fp16 [M, K], unit stride along K
    b_ptr,  # *fp16 [N, K], unit stride along K
    c_ptr,  # *fp16 [M, N], row-major (written)
    ws_ptr,  # *fp32 [SPLIT_K, num_tiles, BLOCK_M * BLOCK_N] partial tiles (SPLIT_K > 1 only)
    cnt_ptr,  # *i32 [num_tiles] arrival counters, all 0 between launches (SPLIT_K > 1 only)
    # sizes
    M,
    N,
    K,
    # strides (elements)
    stride_am,
    stride_bn,
    stride_cm,
    # meta-parameters
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,  # K is a multiple of BLOCK_K * SPLIT_K: no K masks
):
    tile = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    # Grouped tile order (tutorial 03): GROUP_M row-tiles share each B column-tile while it is in L2.
    group_size = GROUP_M * num_pid_n
    first_m = (tile // group_size) * GROUP_M
    rows_in_group = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % group_size) % rows_in_group
    pid_n = (tile % group_size) // rows_in_group

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows past M / N are clamped to valid rows (their results are never stored), so A/B loads need no M/N mask.
    offs_am = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)

    # This program's K slice: k-tiles [pid_k * tiles_per_split, (pid_k + 1) * tiles_per_split).
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_start = pid_k * tiles_per_split * BLOCK_K
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + (k_start + offs_k)[None, :]
    b_ptrs = b_ptr + offs_bn[:, None] * stride_bn + (k_start + offs_k)[None, :]

    # fp32 accumulation on the tensor cores; fp16 x fp16 products are exact.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tiles_per_split):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - (k_start + kt * BLOCK_K)
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc.to(tl.float16), mask=c_mask)  # one RNE fp32 -> fp16
    else:
        is_last, total = _splitk_reduce(acc, ws_ptr, cnt_ptr, tile, pid_k, num_tiles, BLOCK_M, BLOCK_N, SPLIT_K)
        if is_last:
            tl.store(c_ptrs, total.to(tl.float16), mask=c_mask)  # one RNE fp32 -> fp16


@triton.jit
def _store_c(c_desc, acc, m0, n0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr):
    """Store the fp32 tile ``acc`` at C[m0:, n0:] with ONE rounding per element to C's dtype (RNE on the GPU),
    whole (EPILOGUE_SUBTILE = 1) or as two [BLOCK_M, BLOCK_N / 2] column halves (2; c_desc's block is a half)."""
    if EPILOGUE_SUBTILE == 1:
        c_desc.store([m0, n0], acc.to(c_desc.dtype))
    else:
        halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        left, right = tl.split(halves)
        c_desc.store([m0, n0], left.to(c_desc.dtype))
        c_desc.store([m0, n0 + BLOCK_N // 2], right.to(c_desc.dtype))


@triton.jit(do_not_specialize=["M"])
def gemm_fp16_tma_kernel(
    # tensor descriptors (TMA on sm_90); out-of-range rows/columns load as 0 and are not stored
    a_desc,  # fp16 or bf16 [M, K], block [BLOCK_M, BLOCK_K]
    b_desc,  # same dtype as A, [N, K], block [BLOCK_N, BLOCK_K]
    c_desc,  # fp16 or bf16 [M, N], block [BLOCK_M, BLOCK_N] (written)
    # split-K scratch (SPLIT_K > 1 only), as in gemm_fp16_splitk_kernel
    ws_ptr,  # *fp32 [SPLIT_K, num_tiles, BLOCK_M * BLOCK_N]
    cnt_ptr,  # *i32 [num_tiles], all 0 between launches
    scale_ptr,  # *fp32, one element: the epilogue scale (HAS_SCALE only; never read otherwise)
    # sizes
    M,
    N,
    K,
    # meta-parameters
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,  # persistent grid size; program p handles work units p, p + NUM_PROGRAMS, ...
    HAS_SCALE: tl.constexpr,  # epilogue C = round(acc * scale): one fp32 RN multiply, then one rounding to C
    EPILOGUE_SUBTILE: tl.constexpr,  # 1 or 2: C stored in that many column pieces (c_desc block [BM, BN / it])
):
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    group_size = GROUP_M * num_pid_n
    if HAS_SCALE:
        scale = tl.load(scale_ptr)
    # Work unit u = (K slice s, C tile t) with u = s * num_tiles + t: every tile's slice 0 is issued first.
    for unit in tl.range(start, num_tiles * SPLIT_K, NUM_PROGRAMS, flatten=True):
        tile = unit % num_tiles
        pid_k = unit // num_tiles
        first_m = (tile // group_size) * GROUP_M
        rows_in_group = tl.minimum(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + (tile % group_size) % rows_in_group
        pid_n = (tile % group_size) // rows_in_group
        kt0 = pid_k * tiles_per_split
        kt1 = tl.minimum(kt0 + tiles_per_split, k_tiles)
        # One fp32 chain over this K slice per C element (tensor cores); fp16 and bf16 products are exact. K
        # columns past K load as 0 (TMA zero padding), adding exact zeros.
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(kt0, kt1):
            a = a_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])
            b = b_desc.load([pid_n * BLOCK_N, kt * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        if SPLIT_K == 1:
            if HAS_SCALE:
                acc = acc * scale  # fp32, RN
            _store_c(c_desc, acc, pid_m * BLOCK_M, pid_n * BLOCK_N, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE)
        else:
            is_last, total = _splitk_reduce(acc, ws_ptr, cnt_ptr, tile, pid_k, num_tiles, BLOCK_M, BLOCK_N, SPLIT_K)
            if is_last:
                if HAS_SCALE:
                    total = total * scale  # fp32, RN, after the full fixed-order sum
                _store_c(c_desc, total, pid_m * BLOCK_M, pid_n * BLOCK_N, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE)


@triton.jit
def _finish_split_tile(tot, ws_tile, ws_stride_piece, offs_t, n_pieces, cnt, scale_ptr, c_desc, pid_m, pid_n,
                       HAS_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       EPILOGUE_SUBTILE: tl.constexpr):
    """Stream-K tile fix-up: ``tot`` is piece 0's partial; add pieces 1 .. n_pieces-1 from the workspace in that
    fixed order (fp32), reset the tile's counter for the next launch, apply the epilogue scale, round once, store."""
    for s in range(1, n_pieces):
        tot += tl.load(ws_tile + s * ws_stride_piece + offs_t, cache_modifier=".cg")
    tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")  # ready for the next launch
    if HAS_SCALE:
        tot = tot * tl.load(scale_ptr)
    _store_c(c_desc, tot, pid_m * BLOCK_M, pid_n * BLOCK_N, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE)


@triton.jit
def _tile_coords(tile, num_pid_m, group_size, GROUP_M: tl.constexpr):
    """Grouped tile order (tutorial 03), as in both kernels: tile index -> (pid_m, pid_n)."""
    first_m = (tile // group_size) * GROUP_M
    rows_in_group = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % group_size) % rows_in_group
    pid_n = (tile % group_size) // rows_in_group
    return pid_m, pid_n


@triton.jit
def _streamk_owner(i, base, extra):
    """The program whose stream-K range holds K-iteration ``i``: programs 0..extra-1 own base + 1 iterations,
    the others base (ranges contiguous, in program order)."""
    big = extra * (base + 1)
    return tl.where(i < big, i // (base + 1), extra + (i - big) // tl.maximum(base, 1))


@triton.jit
def _tile_chain(a_desc, b_desc, pid_m, pid_n, kt0, kt1, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):  # fmt: skip
    """One fp32 wgmma chain over K-iterations kt0..kt1-1 of C tile (pid_m, pid_n): the same software-pipelined
    loop as gemm_fp16_tma_kernel's (TMA loads num_stages - 1 iterations ahead, async wgmma, wait(1))."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in tl.range(kt0, kt1):
        a = a_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])
        b = b_desc.load([pid_n * BLOCK_N, kt * BLOCK_K])
        acc = tl.dot(a, b.T, acc)
    return acc


@triton.jit(do_not_specialize=["M"])
def gemm_fp16_tma_streamk_kernel(
    a_desc,  # fp16 or bf16 [M, K], block [BLOCK_M, BLOCK_K]
    b_desc,  # same dtype as A, [N, K], block [BLOCK_N, BLOCK_K]
    c_desc,  # fp16 or bf16 [M, N], block [BLOCK_M, BLOCK_N / EPILOGUE_SUBTILE] (written)
    ws_ptr,  # *fp32 [max pieces per tile, stream-K tiles, BLOCK_M * BLOCK_N] partial tiles
    cnt_ptr,  # *i32 [stream-K tiles] arrival counters, all 0 between launches
    scale_ptr,  # *fp32, one element (HAS_SCALE only)
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,  # always 1 (kept so that the launch plan passes the same constexprs)
    GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,  # grid size G
    HAS_SCALE: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    STREAM_K: tl.constexpr,  # 1: every tile in the stream-K phase; 2: only num_tiles % G (hybrid); 3: none
    RANGE_REVERSE: tl.constexpr,  # program p owns stream-K range G-1-p (False: range p); STREAM_K_RANGE_REVERSE
):
    """Deterministic stream-K (see GemmConfig.STREAM_K and stream_k_schedule, its host mirror).

    Stream-K phase: tiles 0..sk_tiles-1 x their k_tiles K-iterations, linearised as tile * k_tiles + kt, are
    cut into NUM_PROGRAMS contiguous ranges r of equal length (+-1); the split points depend only on M, N, K,
    BLOCK_* and NUM_PROGRAMS. A program walks the tiles its range touches (an outer loop over <= a few tiles),
    one fp32 wgmma chain per piece (``_tile_chain``: the plain kernel's pipelined K loop). A piece that is a
    whole tile is stored directly. Split tiles: every piece's fp32 sum ends up added in K order (piece 0, 1,
    ..., P-1; fp32 RNE) by exactly one program, which rounds once and stores; nobody waits for anybody:

    * pieces 1..P-1 (tails) write their partial to workspace slot (piece, tile), then bump the tile's counter
      (acq_rel); the one that sees P-1 earlier arrivals sums the slots 0..P-1 and resets the counter.
    * piece 0 (the head, K-iterations 0..; a range's LAST piece in time, as a range starts in the middle of a
      tile) first reads the counter (acquire). If the P-1 tails have all arrived (the usual case) it sums its
      own registers (slot 0's value, never written) and slots 1..P-1 in order and resets the counter; else it
      writes slot 0 and bumps the counter like a tail (the last arrival sums). The sum is the same either way:
      bitwise deterministic. This halves the workspace traffic of a 2-piece tile (the cost of stream-K here).

    Data-parallel phase (STREAM_K 2 and 3): tiles sk_tiles..num_tiles-1, whole K each, round robin, as the plain
    kernel. RANGE_REVERSE changes which program runs which range, never the split points or the sums (the CPU
    tests run both, so that both fix-up paths run in the sequential interpreter).
    """
    pid = tl.program_id(0)
    if RANGE_REVERSE:
        rng = NUM_PROGRAMS - 1 - pid
    else:
        rng = pid
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    group_size = GROUP_M * num_pid_n
    if HAS_SCALE:
        scale = tl.load(scale_ptr)
    if STREAM_K == 1:
        sk_tiles = num_tiles
    elif STREAM_K == 2:
        sk_tiles = tl.where(num_tiles > NUM_PROGRAMS, num_tiles % NUM_PROGRAMS, num_tiles)
    else:
        sk_tiles = num_tiles * 0
    total = sk_tiles * k_tiles
    base = total // NUM_PROGRAMS
    extra = total % NUM_PROGRAMS
    it = rng * base + tl.minimum(rng, extra)
    it_end = it + base + (rng < extra).to(tl.int32)
    tile_elems = BLOCK_M * BLOCK_N
    offs_t = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    ws_stride_piece = sk_tiles.to(tl.int64) * tile_elems
    if STREAM_K != 3:  # (3: no stream-K phase)
        first_tile = it // k_tiles
        last_tile = tl.where(it < it_end, (it_end - 1) // k_tiles, first_tile - 1)
        for tile in range(first_tile, last_tile + 1):
            t0 = tile * k_tiles
            kt0 = tl.maximum(it - t0, 0)
            kt1 = tl.minimum(it_end - t0, k_tiles)
            pid_m, pid_n = _tile_coords(tile, num_pid_m, group_size, GROUP_M)
            acc = _tile_chain(a_desc, b_desc, pid_m, pid_n, kt0, kt1, BLOCK_M, BLOCK_N, BLOCK_K)
            if (kt0 == 0) & (kt1 == k_tiles):  # the whole tile: no partial
                if HAS_SCALE:
                    acc = acc * scale
                _store_c(c_desc, acc, pid_m * BLOCK_M, pid_n * BLOCK_N, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE)
            else:
                first = _streamk_owner(t0, base, extra)
                n_pieces = _streamk_owner(t0 + k_tiles - 1, base, extra) - first + 1
                piece = rng - first  # position in K order
                ws_tile = ws_ptr + (first_tile.to(tl.int64) + (tile - first_tile)) * tile_elems  # int64 offsets
                tails_in = 0
                if piece == 0:  # the head: have all the tails arrived already?
                    tails_in = tl.atomic_add(cnt_ptr + tile, 0, sem="acquire", scope="gpu")
                if tails_in == n_pieces - 1:  # head with every tail in: sum without writing slot 0
                    _finish_split_tile(acc, ws_tile, ws_stride_piece, offs_t, n_pieces, cnt_ptr + tile, scale_ptr,
                                       c_desc, pid_m, pid_n, HAS_SCALE, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE)
                else:
                    tl.store(ws_tile + piece * ws_stride_piece + offs_t, acc, cache_modifier=".cg")
                    tl.debug_barrier()  # every thread's partial stores precede the release below
                    arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
                    if arrived == n_pieces - 1:  # last to arrive: fixed-order sum of the pieces, s = 0, 1, ...
                        _finish_split_tile(tl.load(ws_tile + offs_t, cache_modifier=".cg"), ws_tile, ws_stride_piece,
                                           offs_t, n_pieces, cnt_ptr + tile, scale_ptr, c_desc, pid_m, pid_n, HAS_SCALE,
                                           BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE)
    if STREAM_K >= 2:
        for tile in tl.range(sk_tiles + pid, num_tiles, NUM_PROGRAMS, flatten=True):
            pid_m, pid_n = _tile_coords(tile, num_pid_m, group_size, GROUP_M)
            acc = _tile_chain(a_desc, b_desc, pid_m, pid_n, 0, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K)
            if HAS_SCALE:
                acc = acc * scale
            _store_c(c_desc, acc, pid_m * BLOCK_M, pid_n * BLOCK_N, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE)


# ---------------------------------------------------------------------------------------------------------------
# Host wrapper
# ---------------------------------------------------------------------------------------------------------------
_WORKSPACES: dict = {}  # (device, stream) -> (fp32 workspace, int32 counters); counters are 0 between launches


def _workspace(device: torch.device, stream: int, ws_elems: int, n_counters: int):
    """Cached split-K workspace for (device, stream); grown when too small (never shrunk).

    One workspace per stream: two launches on the same stream run in order, so they can share it; launches on
    different streams get different workspaces. The counters are zeroed once here and left at 0 by every launch.
    """
    key = (device.type, device.index, stream)
    ws, cnt = _WORKSPACES.get(key, (None, None))
    if ws is None or ws.numel() < ws_elems or cnt.numel() < n_counters:
        ws_n = max(ws_elems, ws.numel() if ws is not None else 0)
        cnt_n = max(n_counters, cnt.numel() if cnt is not None else 0)
        ws = torch.empty(ws_n, dtype=torch.float32, device=device)
        cnt = torch.zeros(cnt_n, dtype=torch.int32, device=device)
        _WORKSPACES[key] = (ws, cnt)
    return ws, cnt


_NUM_SMS: dict = {}


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # CPU interpreter: a few persistent programs, so the persistent loop is exercised
    n = _NUM_SMS.get(device.index)
    if n is None:
        n = _NUM_SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


_NO_PLAN = object()  # _PLANS.get default: "never validated" (a cached None plan means M == 0)


def _check_pair(A, B, rows: str) -> tuple[int, int, int]:
    """(M, N, K) of A [M, K] and B [N, K] after _check_operand: K must match, same device, N and K multiples of
    ALIGN (``rows`` names the reason in the message). Raises ValueError naming the argument."""
    M, K = A.shape
    N, Kb = B.shape
    if Kb != K:
        raise ValueError(f"B.shape={tuple(B.shape)}: expected K={K} columns to match A.shape={tuple(A.shape)}")
    if B.device != A.device:
        raise ValueError(f"A.device={A.device}, B.device={B.device}: expected the same device")
    if K < 1 or K % ALIGN:
        raise ValueError(f"K={K}: expected a positive multiple of {ALIGN} ({rows})")
    if N < 1 or N % ALIGN:
        raise ValueError(f"N={N}: expected a positive multiple of {ALIGN} ({rows})")
    return M, N, K


def _remember_plan(key, plan) -> None:
    if len(_PLANS) >= _MAX_PLANS:  # many distinct shapes: start over rather than grow without bound
        _PLANS.clear()
    _PLANS[key] = plan


def _check_aligned(A, B) -> None:
    """Same shapes, strides, dtypes and devices as a validated call: only pointer alignment can differ."""
    if A.data_ptr() % 16 or B.data_ptr() % 16:
        bad = "A" if A.data_ptr() % 16 else "B"
        raise ValueError(f"{bad}.data_ptr()={(A if bad == 'A' else B).data_ptr():#x}: expected 16-byte alignment")


def _check_operand(name: str, t, dim_name: str, dtypes=(torch.float16,)) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
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
            raise ValueError(f"{name}.stride(0)={s0}: expected a multiple of {ALIGN} elements (16 bytes)")
        if t.data_ptr() % 16:
            raise ValueError(f"{name}.data_ptr()={t.data_ptr():#x}: expected 16-byte alignment")


# ---------------------------------------------------------------------------------------------------------------
# Launch plans. A first call for a given (shapes, strides, devices, config) validates everything, picks the
# config, computes the grid and goes through Triton's JIT (compiling if needed); it keeps the CompiledKernel the
# JIT returns. Later calls with the same key only check what can change between calls (dtypes, pointer
# alignment, ``out``) and launch the kept kernel directly. Why: the JIT re-binds and re-specializes every
# argument on each call, tens of microseconds of Python on the H200 machine's CPU, which an L2-flushed
# CUDA-event timing of a ~5 us kernel measures as kernel time (the GPU idles waiting for the launch).
# The kept kernel is valid for the key: Triton specializes on each integer argument being 1 or a multiple of 16
# (all fixed by shapes and strides in the key; M is do_not_specialize) and on 16-byte pointer alignment (checked
# on every call for A, B, out; torch allocations for C and the workspace).
# ---------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Plan:
    cfg: GemmConfig
    kernel: Any
    grid: tuple
    constexprs: dict
    ws_elems: int
    n_counters: int
    ck: Any = None  # CompiledKernel after the first launch (GPU only)
    fast: Any = None  # TMA kernels: a _launch.RawLauncher, or False where it does not apply (FAST_TMA_LAUNCH)
    desc_args: dict = dataclasses.field(default_factory=dict)  # (A, B, C data pointers) -> encoded descriptors


_PLANS: dict = {}
_MAX_PLANS = 4096


def _make_plan(A, B, M: int, N: int, K: int, config, has_scale: bool = False, table=None) -> _Plan:
    cfg = (pick_config(M, N, K) if table is None else pick_tma_config(M, N, K)) if config is None else config
    if not isinstance(cfg, GemmConfig):
        raise TypeError(f"config: expected a GemmConfig or None, got {type(cfg).__name__}")
    BM, BN, BK, S = cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K, cfg.SPLIT_K
    num_tiles = -(-M // BM) * -(-N // BN)
    ws_elems = S * num_tiles * BM * BN if S > 1 else 0
    if cfg.STREAM_K:
        nprog = launch_programs(cfg, M, N, K, _num_sms(A.device))
        sch = stream_k_schedule(cfg, M, N, K, nprog)
        ws_elems = sch["max_pieces"] * sch["sk_tiles"] * BM * BN if sch["split_tiles"] else 0
        constexprs = dict(BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, SPLIT_K=1, GROUP_M=cfg.GROUP_M, NUM_PROGRAMS=nprog,
                          HAS_SCALE=has_scale, EPILOGUE_SUBTILE=cfg.EPILOGUE_SUBTILE, STREAM_K=cfg.STREAM_K,
                          RANGE_REVERSE=bool(STREAM_K_RANGE_REVERSE))  # fmt: skip
        return _Plan(cfg, gemm_fp16_tma_streamk_kernel, (nprog, 1, 1), constexprs, ws_elems, sch["sk_tiles"])
    if cfg.kernel == "tma":
        nprog = launch_programs(cfg, M, N, K, _num_sms(A.device))
        constexprs = dict(BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, SPLIT_K=S, GROUP_M=cfg.GROUP_M, NUM_PROGRAMS=nprog,
                          HAS_SCALE=has_scale, EPILOGUE_SUBTILE=cfg.EPILOGUE_SUBTILE)  # fmt: skip  (kernel order)
        return _Plan(cfg, gemm_fp16_tma_kernel, (nprog, 1, 1), constexprs, ws_elems, num_tiles)
    if has_scale:
        raise ValueError(f"config={cfg}: a scale needs a 'tma' config")
    constexprs = dict(BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, SPLIT_K=S, GROUP_M=cfg.GROUP_M, EVEN_K=(K % (BK * S) == 0))
    return _Plan(cfg, gemm_fp16_splitk_kernel, (num_tiles, S, 1), constexprs, ws_elems, num_tiles)


def launch_programs(cfg: GemmConfig, M: int, N: int, K: int, num_sms: int) -> int:
    """Grid size of a "tma" launch: min(work units, PROGRAMS_PER_SM x num_sms); work units are (tile, K slice)
    pairs, or for STREAM_K 1/2 (tile, K-iteration) pairs (so every program gets >= 1 iteration); STREAM_K 3:
    tiles."""
    tiles = -(-M // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N)
    units = tiles * (-(-K // cfg.BLOCK_K) if cfg.STREAM_K in (1, 2) else cfg.SPLIT_K)
    return min(units, num_sms * cfg.PROGRAMS_PER_SM)


# Stream-K: which program runs which range (gemm_fp16_tma_streamk_kernel's RANGE_REVERSE; never changes the
# split points or the sums). True: program p runs range G-1-p; in the sequential CPU interpreter a split
# tile's head then arrives last (the head fast path); False exercises the tails' last-arrival path. Set
# before the first call of a shape, or clear_plans().
STREAM_K_RANGE_REVERSE = True

# Launch TMA kernels with descriptors encoded once per (A, B, C) pointers (_launch.RawLauncher); False forces
# Triton's launcher, which encodes them on every call (set before the first call of a shape, or clear_plans()).
FAST_TMA_LAUNCH = True


def _run_plan(plan: _Plan, A, B, C, M: int, N: int, K: int, sa: int, sb: int, scale=None) -> None:
    device = A.device
    is_cuda = device.type == "cuda"
    stream = triton.runtime.driver.active.get_current_stream(device.index) if is_cuda else 0
    if plan.ws_elems:
        ws, cnt = _workspace(device, stream, plan.ws_elems, plan.n_counters)
    else:
        ws, cnt = C, C  # never read when SPLIT_K == 1
    first = plan.ck is None
    tma = plan.kernel is not gemm_fp16_splitk_kernel
    if tma:
        ce = plan.constexprs
        BM, BN, BK = ce["BLOCK_M"], ce["BLOCK_N"], ce["BLOCK_K"]
        if not first and plan.fast is None:  # first direct launch: can the C launcher take cached encodings?
            plan.fast = raw_launcher(plan.ck, 3) if FAST_TMA_LAUNCH else False
        if plan.fast and not hooks_installed():
            # The plan fixes shapes, strides, dtypes and block shapes, so an encoded descriptor depends only on
            # the data pointer: cache the encodings per (A, B, C) pointers (a few entries; no tensor is kept).
            raw = plan.fast
            dkey = (A.data_ptr(), B.data_ptr(), C.data_ptr())
            enc = plan.desc_args.get(dkey)
            if enc is None:
                enc = raw.encode((tensor_desc(A, [M, K], [sa, 1], [BM, BK], False),
                                  tensor_desc(B, [N, K], [sb, 1], [BN, BK], False),
                                  tensor_desc(C, [M, N], [N, 1], [BM, BN // ce["EPILOGUE_SUBTILE"]], False)))
                if len(plan.desc_args) >= 16:
                    plan.desc_args.clear()
                plan.desc_args[dkey] = enc
            try:
                raw.fn(*raw.head(plan.grid, stream), *enc, ws, cnt, ws if scale is None else scale, M, N, K,
                       *ce.values())  # fmt: skip
                return
            except (TypeError, ValueError, SystemError):  # argument packing rejected: use Triton's own path
                plan.fast = False
        descs = (tensor_desc(A, [M, K], [sa, 1], [BM, BK], first),
                 tensor_desc(B, [N, K], [sb, 1], [BN, BK], first),
                 tensor_desc(C, [M, N], [N, 1], [BM, BN // ce["EPILOGUE_SUBTILE"]], first))  # fmt: skip
        args = (*descs, ws, cnt, ws if scale is None else scale, M, N, K)
    else:
        args = (A, B, C, ws, cnt, M, N, K, sa, sb, N)
    if first:
        cfg = plan.cfg
        ck = plan.kernel[plan.grid](*args, **plan.constexprs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        if is_cuda and ck is not None:
            plan.ck = ck
        return
    # parameter order: runtime arguments, then the constexprs
    launch_compiled(plan.ck, plan.grid, stream, (*args, *plan.constexprs.values()))


def gemm_fp16(
    A: torch.Tensor, B: torch.Tensor, config: GemmConfig | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """C = A @ B.T in fp16 with fp32 accumulation and one RNE rounding to fp16 (see NUMERIC_CONTRACT).

    Args:
        A: torch.float16 [M, K], any M >= 0, unit stride along K, row stride a multiple of 8, 16-byte aligned.
        B: torch.float16 [N, K], N >= 1 and K >= 1 multiples of 8 (ALIGN), same layout rules; same device as A.
        config: override the CONFIG_TABLE choice (tests and tuning); None picks ``pick_config(M, N, K)``.
        out: optional preallocated result, torch.float16 [M, N], contiguous, on A's device (every element is
            written; tests pass a NaN-poisoned buffer). None allocates one.

    Returns:
        torch.float16 [M, N] (``out`` when given), contiguous; bitwise deterministic run to run. M = 0 gives
        [0, N].

    Raises:
        TypeError: A, B or out is not a float16 torch.Tensor; config is not a GemmConfig.
        ValueError: not 2-D, K mismatch, N or K not a multiple of 8 or < 1, bad strides/alignment, devices differ,
            ``out`` of the wrong shape/device or not contiguous.

    Concurrency: split-K configs use a workspace per (device, stream); calls on one stream are safe, as are
    calls on different streams.

    Source: workload gemm_n3072_k2048 (FlashInfer-Bench; /work/shared/facts/seeds.md §3), C = A @ B.T.
    """
    if not isinstance(A, torch.Tensor) or not isinstance(B, torch.Tensor):
        bad = "A" if not isinstance(A, torch.Tensor) else "B"
        raise TypeError(f"{bad}: expected a torch.Tensor, got {type(A if bad == 'A' else B).__name__}")
    if config is not None and not isinstance(config, GemmConfig):
        raise TypeError(f"config: expected a GemmConfig or None, got {type(config).__name__}")
    key = (A.dtype, B.dtype, A.shape, A.stride(), B.shape, B.stride(), A.device, B.device, config)
    plan = _PLANS.get(key, _NO_PLAN)
    if plan is _NO_PLAN:
        _check_operand("A", A, "M")
        _check_operand("B", B, "N")
        M, N, K = _check_pair(A, B, "16-byte fp16 rows")
        plan = _make_plan(A, B, M, N, K, config) if M > 0 else None
        _remember_plan(key, plan)
    else:
        _check_aligned(A, B)
    M, K = A.shape
    N = B.shape[0]
    if out is None:
        C = torch.empty((M, N), dtype=torch.float16, device=A.device)
    else:
        if not isinstance(out, torch.Tensor) or out.dtype != torch.float16:
            raise TypeError(f"out: expected a torch.float16 tensor, got {getattr(out, 'dtype', type(out).__name__)}")
        if tuple(out.shape) != (M, N) or out.device != A.device or not out.is_contiguous():
            raise ValueError(
                f"out.shape={tuple(out.shape)} on {out.device} (contiguous={out.is_contiguous()}): expected a "
                f"contiguous [{M}, {N}] tensor on {A.device}"
            )
        if out.data_ptr() % 16:
            raise ValueError(f"out.data_ptr()={out.data_ptr():#x}: expected 16-byte alignment")
        C = out
    if M == 0:
        return C
    # Row strides: a dimension of size 1 never uses its stride; pass K (a valid row stride) so the kernel's
    # specialization does not depend on an arbitrary value.
    sa = A.stride(0) if M > 1 else K
    sb = B.stride(0) if N > 1 else K
    _run_plan(plan, A, B, C, M, N, K, sa, sb)
    return C


# ---------------------------------------------------------------------------------------------------------------
# Reusable entry point of the persistent TMA kernel (fp16 or bf16, optional fp32 epilogue scale)
# ---------------------------------------------------------------------------------------------------------------
# Default TMA configs by M (upper bound inclusive) for gemm_tma when the caller passes no config. NOT tuned for any
# workload except that the last row is the fp16 N=3072/K=2048 large-M pick; callers with a known shape (e.g. the
# NVFP4 linear's bf16 N = K = 8192) should pass their own GemmConfig("tma", ...) per call, or replace this tuple
# (module attribute; plans made from it are keyed by the tuple's identity, so a replacement takes effect).
TMA_CONFIGS: tuple[tuple[int, GemmConfig], ...] = (
    (64, GemmConfig("tma", 64, 128, 128, SPLIT_K=4, num_warps=4, num_stages=4, PROGRAMS_PER_SM=2)),
    (256, GemmConfig("tma", 64, 128, 64, SPLIT_K=2, num_warps=4, num_stages=6, PROGRAMS_PER_SM=2)),
    (2**62, GemmConfig("tma", 128, 256, 64, SPLIT_K=1, num_warps=8, num_stages=3, GROUP_M=8)),
)


def pick_tma_config(M: int, N: int, K: int) -> GemmConfig:
    """The TMA_CONFIGS entry for ``M`` (first row whose bound is >= M); gemm_tma's default."""
    for bound, cfg in TMA_CONFIGS:
        if M <= bound:
            return cfg
    raise ValueError(f"M={M}: larger than every TMA_CONFIGS bound")


def clear_plans() -> None:
    """Forget every cached launch plan (after changing CONFIG_TABLE or TMA_CONFIGS)."""
    _PLANS.clear()


_TMA_DTYPES = (torch.float16, torch.bfloat16)


def gemm_tma(
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    scale: torch.Tensor | None = None,
    config: GemmConfig | None = None,
) -> torch.Tensor:
    """C = round(scale * (A @ B.T)) with the persistent TMA kernel; fp16 or bf16 operands, fp32 accumulation.

    Numerics: products exact (fp16 and bf16 have <= 11 significant bits); per K slice one fp32 tensor-core chain
    (``accumulation_model(cfg, K, inputs=A.dtype)``: ``hopper_fp16_wgmma`` / ``hopper_bf16_wgmma``, the same
    model); SPLIT_K > 1: fixed-order fp32 RNE sum of the partials (bitwise deterministic); with ``scale``: ONE
    fp32 multiply acc * scale (RN), then ONE rounding to C's dtype (RNE on the GPU: cvt.rn.f16.f32 /
    cvt.rn.bf16.f32; overflow -> +-inf). Without ``scale`` the path is exactly gemm_fp16's TMA path. In the CPU
    interpreter fp32 -> bf16 truncates (facts/triton.md): check interpreted bf16 outputs with faithful rounding.

    Args:
        A: [M, K] torch.float16 or torch.bfloat16, unit stride along K, row stride a multiple of 8 elements,
            16-byte aligned; any M >= 0.
        B: [N, K], same dtype and layout rules as A, same device; N >= 1 and K >= 1 multiples of 8.
        C: [M, N] preallocated output, torch.float16 or torch.bfloat16 (usually A's dtype), contiguous, 16-byte
            aligned, same device; every element is written.
        scale: None, or a 1-element torch.float32 tensor on A's device (read by the kernel; no host sync, so it
            may be produced by an earlier kernel on the same stream).
        config: a ``GemmConfig("tma", ...)`` (BLOCK_M a multiple of 64 with num_warps % 4 == 0 for wgmma);
            None picks ``pick_tma_config(M, N, K)`` from TMA_CONFIGS. Launch plans (validated arguments, grid,
            compiled kernel) are cached per (dtypes, shapes, strides, devices, config, scale or not), as for
            gemm_fp16; tensor descriptors are rebuilt per call without re-validation.

    Returns:
        C.

    Raises:
        TypeError: A, B, C or scale is not a torch.Tensor of an accepted dtype; A and B dtypes differ; config is
            not a GemmConfig.
        ValueError: shapes, strides, alignment or devices as for gemm_fp16; C of the wrong shape/device or not
            contiguous; scale not a 1-element tensor on A's device; config.kernel != "tma".
    """
    for name, t in (("A", A), ("B", B), ("C", C)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if scale is not None:
        if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
            raise TypeError(f"scale: expected None or a torch.float32 tensor, got "
                            f"{getattr(scale, 'dtype', type(scale).__name__)}")  # fmt: skip
        if scale.numel() != 1 or scale.device != A.device:
            raise ValueError(f"scale: expected 1 element on {A.device}, got shape {tuple(scale.shape)} on "
                             f"{scale.device}")  # fmt: skip
    if config is not None and (not isinstance(config, GemmConfig)):
        raise TypeError(f"config: expected a GemmConfig or None, got {type(config).__name__}")
    if config is not None and config.kernel != "tma":
        raise ValueError(f"config.kernel={config.kernel!r}: gemm_tma needs a 'tma' config")
    has_scale = scale is not None
    key = ("tma", A.dtype, B.dtype, C.dtype, A.shape, A.stride(), B.shape, B.stride(), A.device, B.device, config,
           has_scale, has_scale and scale.data_ptr() % 16 == 0, id(TMA_CONFIGS) if config is None else None)
    plan = _PLANS.get(key, _NO_PLAN)
    if plan is _NO_PLAN:
        _check_operand("A", A, "M", _TMA_DTYPES)
        _check_operand("B", B, "N", _TMA_DTYPES)
        if B.dtype != A.dtype:
            raise TypeError(f"A.dtype={A.dtype}, B.dtype={B.dtype}: expected the same dtype")
        if C.dtype not in _TMA_DTYPES:
            raise TypeError(f"C.dtype={C.dtype}: expected torch.float16 or torch.bfloat16")
        M, N, K = _check_pair(A, B, "16-byte rows")
        plan = _make_plan(A, B, M, N, K, config, has_scale, table=TMA_CONFIGS) if M > 0 else None
        _remember_plan(key, plan)
    else:
        _check_aligned(A, B)
    M, K = A.shape
    N = B.shape[0]
    if tuple(C.shape) != (M, N) or C.device != A.device or not C.is_contiguous():
        raise ValueError(f"C.shape={tuple(C.shape)} on {C.device} (contiguous={C.is_contiguous()}): expected a "
                         f"contiguous [{M}, {N}] tensor on {A.device}")  # fmt: skip
    if C.data_ptr() % 16:
        raise ValueError(f"C.data_ptr()={C.data_ptr():#x}: expected 16-byte alignment")
    if M == 0:
        return C
    sa = A.stride(0) if M > 1 else K
    sb = B.stride(0) if N > 1 else K
    _run_plan(plan, A, B, C, M, N, K, sa, sb, scale)
    return C


def TmaConfig(*args, **kw):  # TEMP shim: the gemm_fp16 package provides TmaConfig; the lead drops this commit
    return GemmConfig("tma", *args, **kw)
