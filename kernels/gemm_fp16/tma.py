"""The TMA paths of gemm_fp16 and gemm_tma (``TmaConfig``; large M, compute-bound).

* ``gemm_fp16_tma_kernel`` (``STREAM_K == 0``): tensor descriptors (TMA on sm_90), persistent programs walking
  (K slice, C tile) work units in grouped order; SPLIT_K > 1 uses the split-K path's deterministic last-arrival
  reduction (``splitk._splitk_reduce``).
* ``gemm_fp16_tma_streamk_kernel`` (``STREAM_K`` 1, 2 or 3): the same tiles on a grid of PROGRAMS_PER_SM x SMs,
  each program an equal contiguous range of (tile, K-iteration) pairs (1: all tiles; 2: data-parallel full
  waves, stream-K only for the last partial wave; 3: data-parallel only, in a loop Triton flattens over
  (tile, K)), against wave quantization (e.g. 96 or 204 tiles on 132 SMs). A tile cut into several pieces is
  summed in K order (piece 0, 1, ...) by exactly one program (the head piece from registers when the tails are
  in, else the last arrival): bitwise deterministic, no waits. ``configs.stream_k_schedule`` mirrors the split
  points.

Both take fp16 or bf16 operands and an optional fp32 epilogue scale read from device memory (constexpr
HAS_SCALE: one fp32 multiply acc * scale, then ONE rounding to C's dtype).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .splitk import _splitk_reduce

__all__ = ["gemm_fp16_tma_kernel", "gemm_fp16_tma_streamk_kernel", "tma_kernel", "tma_constexprs"]


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
    RANGE_REVERSE: tl.constexpr,  # program p owns stream-K range G-1-p (False: range p); TmaConfig.RANGE_REVERSE
):
    """Deterministic stream-K (see TmaConfig.STREAM_K and stream_k_schedule, its host mirror).

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


def tma_kernel(config):
    """The jit kernel that serves a TmaConfig: the stream-K kernel when ``config.STREAM_K``, else the plain one."""
    return gemm_fp16_tma_streamk_kernel if config.STREAM_K else gemm_fp16_tma_kernel


def tma_constexprs(config, num_programs: int, has_scale: bool) -> dict:
    """``tma_kernel(config)``'s constexpr arguments, in parameter order."""
    ce = dict(BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K, SPLIT_K=config.SPLIT_K,
              GROUP_M=config.GROUP_M, NUM_PROGRAMS=num_programs, HAS_SCALE=has_scale,
              EPILOGUE_SUBTILE=config.EPILOGUE_SUBTILE)  # fmt: skip
    if config.STREAM_K:
        ce.update(STREAM_K=config.STREAM_K, RANGE_REVERSE=bool(config.RANGE_REVERSE))
    return ce
