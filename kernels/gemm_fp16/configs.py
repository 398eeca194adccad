"""Configs of the gemm_fp16 paths, the table that picks one per M, and the numeric contract.

One frozen dataclass per path; the type says which kernel serves a call:

* ``SplitKConfig``: ``splitk.gemm_fp16_splitk_kernel`` (pointer loads, one program per (C tile, K slice)).
* ``TmaConfig``: ``tma.gemm_fp16_tma_kernel`` (persistent, TMA descriptors) when ``STREAM_K == 0``, else
  ``tma.gemm_fp16_tma_streamk_kernel`` (deterministic stream-K on a grid of PROGRAMS_PER_SM x SMs).
* ``GluonConfig``: ``gluon.gemm_swapab_kernel`` (Gluon, sm_90 only: swap-AB wgmma, TMA / mbarrier ring; M <= 256).
* ``PersistentConfig``: ``persistent.gemm_persistent_kernel`` (Gluon, sm_90 only: persistent, warp-specialized
  wgmma with a deterministic stream-K schedule; large M).
* ``GemvConfig``: ``gemv.gemm_fp16_gemv_kernel`` (``tl``, CUDA cores, no tensor cores; M <= ``max_m``: M = 1-2
  on a GPU).

On a GPU ``CONFIGS`` serves every M; the Triton CPU interpreter (which cannot run Gluon) uses
``INTERPRETER_CONFIGS``, the ``tl`` paths.

``CONFIGS`` (gemm_fp16's table, tuned for the gemm_n3072_k2048 workload on the H200; its 192 x 128 rows on an
H100) and ``TMA_CONFIGS``
(gemm_tma's defaults) are ``_runtime.ConfigTable``\\ s keyed on M; ``accumulation_model`` names the fp4ref.bounds
model of one config at one K, and ``NUMERIC_CONTRACT`` is what ``fp4ref verify`` and the tests read
(docs/kernels.md, "gemm_fp16").
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from .. import _runtime
from .._gluon import check_cluster, exchange_bytes
from .._runtime import ConfigTable
from .._sm90 import SM90_MAX_SHARED_BYTES

__all__ = [
    "SplitKConfig", "TmaConfig", "GluonConfig", "PersistentConfig", "GemvConfig", "CONFIGS", "INTERPRETER_CONFIGS",
    "TMA_CONFIGS", "NUMERIC_CONTRACT",
    "pick_config", "accumulation_model", "launch_programs", "stream_k_schedule",
]


@dataclasses.dataclass(frozen=True)
class _Tiles:
    """The fields every gemm_fp16 path has (not a config itself: a call runs a SplitKConfig or a TmaConfig)."""

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    SPLIT_K: int = 1
    GROUP_M: int = 8
    num_warps: int = 4
    num_stages: int = 4

    def __post_init__(self):
        _runtime.check_int_fields(self, "BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "GROUP_M", "num_warps",
                                  "num_stages", *self._MORE_INTS)
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "GROUP_M", "num_warps") + self._POWERS_OF_TWO:
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name}={v}: expected a power of two >= 1")
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):  # (a TMA box is at most 256 wide; tl tiles no larger here)
            if getattr(self, name) > 256:
                raise ValueError(f"{name}={getattr(self, name)}: expected at most 256")
        if self.num_warps > 16:
            raise ValueError(f"num_warps={self.num_warps}: expected at most 16")
        if self.num_stages < 1:
            raise ValueError(f"num_stages={self.num_stages}: expected >= 1")

    _POWERS_OF_TWO = ()  # further fields a subclass requires to be powers of two
    _MORE_INTS = ()  # further int fields of a subclass

    @property
    def uses_wgmma(self) -> bool:
        """True when Triton lowers this config's tl.dot to Hopper wgmma (block M multiple of 64, warps % 4 == 0)."""
        return self.BLOCK_M % 64 == 0 and self.num_warps % 4 == 0


@dataclasses.dataclass(frozen=True)
class SplitKConfig(_Tiles):
    """A launch of ``gemm_fp16_splitk_kernel`` (pointer loads; small M, memory-bound on B).

    BLOCK_M/BLOCK_N/BLOCK_K: tile sizes (elements). SPLIT_K: K slices per C tile (1 = no split; > 1: fp32 partials
    summed by the last arriving program in the fixed order s = 0, 1, ...). GROUP_M: tile-order grouping along M
    (L2 reuse). num_warps/num_stages: Triton launch options.

    Raises:
        TypeError: a field that is not an int. ValueError: a size that is not a power of two >= 1, a tile size
            above 256, num_warps above 16, num_stages < 1.
    """


@dataclasses.dataclass(frozen=True)
class TmaConfig(_Tiles):
    """A launch of the persistent TMA kernel (``STREAM_K == 0``) or of the stream-K kernel (``STREAM_K`` 1-3).

    The fields of SplitKConfig, plus:

    PROGRAMS_PER_SM: grid = min(work units, PROGRAMS_PER_SM x SM count) (``launch_programs``); 1 is fully
    persistent, larger values let several programs share an SM.
    EPILOGUE_SUBTILE: the C tile is stored as this many [BLOCK_M, BLOCK_N / EPILOGUE_SUBTILE] pieces (1 or 2),
    which shrinks the shared-memory staging buffer of the TMA store (room for one more pipeline stage); every
    element is still rounded once, so the numerics do not depend on it.
    STREAM_K (SPLIT_K = 1 only): 0 = the persistent tile kernel; 1 = deterministic stream-K over every tile
    (grid = PROGRAMS_PER_SM x SMs, each program an equal contiguous range of the tiles x K-iterations); 2 =
    hybrid: the num_tiles // grid full waves data-parallel (whole tiles), stream-K only for the num_tiles % grid
    tiles of the last partial wave (all tiles when num_tiles < grid); 3 = no stream-K phase: every tile
    data-parallel in the stream-K kernel's loop, which Triton flattens over (tile, K-iteration) (static K
    bounds: the next tile's TMA loads run ahead while this one is stored). Split tiles are summed in K order by
    exactly one program (``stream_k_schedule``, ``accumulation_model``).
    RANGE_REVERSE (stream-K only): program p runs stream-K range G-1-p (False: range p). It never changes the
    split points or the sums, only which program arrives last: in the sequential CPU interpreter True makes a
    split tile's head arrive last (the head path), False a tail (the last-arrival path); the tests run both.

    Raises:
        TypeError: a field that is not an int (RANGE_REVERSE: a bool). ValueError: as SplitKConfig; EPILOGUE_SUBTILE
            not 1 or 2; STREAM_K not 0-3, or STREAM_K with SPLIT_K > 1.
    """

    PROGRAMS_PER_SM: int = 1
    EPILOGUE_SUBTILE: int = 1
    STREAM_K: int = 0
    RANGE_REVERSE: bool = True

    _POWERS_OF_TWO = ("PROGRAMS_PER_SM",)
    _MORE_INTS = ("PROGRAMS_PER_SM", "EPILOGUE_SUBTILE", "STREAM_K")

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.RANGE_REVERSE, bool):
            raise TypeError(f"RANGE_REVERSE={self.RANGE_REVERSE!r}: expected a bool")
        if self.EPILOGUE_SUBTILE not in (1, 2):
            raise ValueError(f"EPILOGUE_SUBTILE={self.EPILOGUE_SUBTILE}: expected 1 or 2")
        if self.STREAM_K not in (0, 1, 2, 3) or (self.STREAM_K and self.SPLIT_K != 1):
            raise ValueError(f"STREAM_K={self.STREAM_K}: expected 0, or 1/2/3 with SPLIT_K=1")


@dataclasses.dataclass(frozen=True)
class GluonConfig:
    """A launch of the Gluon swap-AB kernel (``gluon.gemm_swapab_kernel``; sm_90 only, M <= 256).

    BLOCK_N: rows of B (= columns of C) per CTA: 64 per warpgroup row block (64, 128 or 256).
    BLOCK_M: the padded M (the wgmma N width): a power of two in 8..256, or the sum of two (48, 80, 96, 144, 160,
        192, ..., at most 256; then two wgmmas per stage, one per part, and SPLIT_K 1 without WARP_SPEC); M >
        BLOCK_M runs ceil(M / BLOCK_M) M tiles, each re-reading B (mostly from L2).
    BLOCK_K: K per pipeline stage (16, 32, 64 or 128).
    STAGES: depth of the TMA / mbarrier ring (>= 2).
    SPLIT_K: K slices per C tile; each covers ceil(K tiles / SPLIT_K) K tiles (``k_split``), summed by the last
        arriving CTA in the fixed order s = 0, 1, ... (fp32 RN).
    num_warps: 4 (one warpgroup) or 8 (two warpgroups stacked along BLOCK_N).
    WARP_SPEC: a 1-warp TMA producer partition (``gl.warp_specialize``) feeds the ring through "empty" barriers.
    CLUSTER: the SPLIT_K slices of a C tile run as one thread-block cluster and are summed in the same order
        through distributed shared memory by its first CTA (kernels/_gluon.py ``cluster_sum``; same bits, no
        workspace); SPLIT_K 2, 4 or 8, one-part BLOCK_M, no WARP_SPEC, the SPLIT_K - 1 fp32 tiles the first CTA
        receives within 48 KiB (``_gluon.check_cluster``). At a K that gives fewer slices the workspace reduction
        runs instead (``cluster_size``; the same bits).

    Raises:
        TypeError: a field of the wrong type. ValueError: a value the kernel cannot take, an accumulator of
            more than 128 fp32 registers per thread (it would spill), or shared memory over the sm_90 limit
            (``shared_bytes``).
    """

    BLOCK_N: int = 64
    BLOCK_M: int = 64
    BLOCK_K: int = 128
    STAGES: int = 4
    SPLIT_K: int = 1
    num_warps: int = 4
    WARP_SPEC: bool = False
    CLUSTER: bool = False

    def __post_init__(self):
        for name in ("WARP_SPEC", "CLUSTER"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}={getattr(self, name)!r}: expected a bool")
        _runtime.check_int_fields(self, "BLOCK_N", "BLOCK_M", "BLOCK_K", "STAGES", "SPLIT_K", "num_warps")
        if self.num_warps not in (4, 8):
            raise ValueError(f"num_warps={self.num_warps}: expected 4 or 8 (whole warpgroups)")
        if self.BLOCK_N not in (64, 128, 256) or self.BLOCK_N < 16 * self.num_warps:
            raise ValueError(f"BLOCK_N={self.BLOCK_N}: expected 64, 128 or 256 and >= 16 * num_warps")
        _hi, lo = _runtime.check_tile_width("BLOCK_M", self.BLOCK_M)
        if lo and (self.SPLIT_K != 1 or self.WARP_SPEC):
            raise ValueError(f"BLOCK_M={self.BLOCK_M} (two wgmma parts): expected SPLIT_K=1 and WARP_SPEC=False, "
                             f"got SPLIT_K={self.SPLIT_K}, WARP_SPEC={self.WARP_SPEC}")
        if self.BLOCK_K not in (16, 32, 64, 128):
            raise ValueError(f"BLOCK_K={self.BLOCK_K}: expected 16, 32, 64 or 128")
        if self.STAGES < 2:
            raise ValueError(f"STAGES={self.STAGES}: expected >= 2")
        if self.SPLIT_K < 1:
            raise ValueError(f"SPLIT_K={self.SPLIT_K}: expected >= 1")
        acc_regs = self.BLOCK_N * self.BLOCK_M // (32 * self.num_warps)
        if acc_regs > 128:
            raise ValueError(f"{self}: {acc_regs} fp32 accumulator registers per thread (> 128 spills)")
        if self.CLUSTER:  # the exchange buffer comes on top of the ring
            if self.WARP_SPEC:
                raise ValueError("WARP_SPEC=True: CLUSTER=True needs WARP_SPEC=False")
            check_cluster(self, self.BLOCK_N * self.BLOCK_M, self.shared_bytes)
        elif self.shared_bytes > SM90_MAX_SHARED_BYTES:
            raise ValueError(f"{self}: {self.shared_bytes} bytes of shared memory for the STAGES x (BLOCK_N + BLOCK_M) "
                             f"x BLOCK_K ring (sm_90 limit {SM90_MAX_SHARED_BYTES})")

    @property
    def shared_bytes(self) -> int:
        """Shared memory of the TMA ring and its barriers and, with CLUSTER, the exchange buffer (kernels/_gluon.py
        ``exchange_bytes``; at a K that gives fewer slices it is not declared)."""
        return (self.STAGES * (self.BLOCK_N + self.BLOCK_M) * self.BLOCK_K * 2 + 16 * self.STAGES
                + exchange_bytes(self.BLOCK_N * self.BLOCK_M, self.SPLIT_K if self.CLUSTER else 1))

    def k_split(self, K: int) -> tuple[int, int]:
        """(K tiles per slice, slices launched) at this K: the last slice may be shorter, none is empty."""
        return _runtime.k_split(-(-K // self.BLOCK_K), self.SPLIT_K)

    def cluster_size(self, K: int) -> int:
        """CTAs per thread-block cluster at reduction length K: SPLIT_K with CLUSTER where K gives SPLIT_K slices,
        else 1 (no cluster: the workspace reduction, which adds the slices in the same order)."""
        return self.SPLIT_K if self.CLUSTER and self.k_split(K)[1] == self.SPLIT_K else 1


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    """A launch of the GEMV kernel (``gemv.gemm_fp16_gemv_kernel``: CUDA cores, no split-K; a few rows of A).

    BLOCK_N: rows of B (= columns of C) per program (a power of two, 1..64).
    BLOCK_K: K per loop iteration (a power of two, 16..8192): each program streams its BLOCK_N rows of B over the
        whole K, BLOCK_N x BLOCK_K elements per iteration.
    num_warps: 1, 2, 4 or 8.

    Every row of A (BLOCK_M = M padded to a power of two) is multiplied by every element of B a program loads, so
    a config serves M <= ``max_m`` only: the per-iteration products BLOCK_M x BLOCK_N x BLOCK_K stay within 128
    fp32 registers per thread.

    Raises:
        TypeError: a field that is not an int. ValueError: a value outside the ranges above.
    """

    BLOCK_N: int = 1
    BLOCK_K: int = 2048
    num_warps: int = 1

    MAX_PRODUCTS_PER_THREAD: ClassVar[int] = 128

    def __post_init__(self):
        _runtime.check_int_fields(self, "BLOCK_N", "BLOCK_K", "num_warps")
        for name, lo, hi in (("BLOCK_N", 1, 64), ("BLOCK_K", 16, 8192), ("num_warps", 1, 8)):
            v = getattr(self, name)
            if not lo <= v <= hi or v & (v - 1):
                raise ValueError(f"{name}={v}: expected a power of two in {lo}..{hi}")
        if self.max_m < 1:
            per_thread = self.BLOCK_N * self.BLOCK_K // (32 * self.num_warps)
            raise ValueError(f"{self}: BLOCK_N x BLOCK_K / (32 x num_warps) = {per_thread} products per thread for one "
                             f"row of A exceed {self.MAX_PRODUCTS_PER_THREAD} fp32 registers per thread")

    @property
    def max_m(self) -> int:
        """The largest M this config serves (a power of two; 0 when not even one row fits)."""
        per_row = self.BLOCK_N * self.BLOCK_K // (32 * self.num_warps)
        fit = self.MAX_PRODUCTS_PER_THREAD // max(1, per_row)
        return 1 << (fit.bit_length() - 1) if fit >= 1 else 0


@dataclasses.dataclass(frozen=True)
class PersistentConfig:
    """A launch of the Gluon persistent kernel (``persistent.gemm_persistent_kernel``; sm_90 only, large M).

    BLOCK_M: rows of A and C per tile, 64 per consumer warpgroup (64 or 128; ``num_warps`` = BLOCK_M // 16), or
        192 = 128 + 64 in two row parts (the low part's warpgroup in a worker partition of its own; whole tiles
        only; BLOCK_N 64 or 128), so that M = 2053 makes 11 row tiles: 264 tiles of 192 x 128, two whole waves of
        132 SMs.
    BLOCK_N: rows of B (= columns of C) per tile: the wgmma N width (64, 128 or 256), or 192 = 128 + 64 in two
        column parts (``m_parts``; two wgmmas per K step, one accumulator each, whole tiles only: STREAM_K 0), so
        that N = 3072 makes 16 column tiles (128 tiles at M = 972: 0.97 of a 132-SM wave, against 96 of 128 x 256).
    BLOCK_K: K per ring step (32, 64 or 128).
    STAGES: depth of the TMA / mbarrier ring (>= 2).
    GROUP_M: row tiles per group of the grouped tile order (a power of two).
    STREAM_K: 0 = whole tiles only; 1 = deterministic stream-K over every tile; 2 = stream-K over the last
        partial wave's tiles, the full waves as whole tiles (``stream_k_schedule``; split tiles summed in K
        order by exactly one CTA).
    The grid is one CTA per SM (``launch_programs``; ``SPLIT_K`` and ``PROGRAMS_PER_SM`` are fixed at 1).

    Raises:
        TypeError: a field that is not an int. ValueError: a value the kernel cannot take, or shared memory over
            the sm_90 limit (``shared_bytes``).
    """

    BLOCK_M: int = 128
    BLOCK_N: int = 256
    BLOCK_K: int = 64
    STAGES: int = 3
    GROUP_M: int = 8
    STREAM_K: int = 2

    SPLIT_K: ClassVar[int] = 1
    PROGRAMS_PER_SM: ClassVar[int] = 1

    def __post_init__(self):
        _runtime.check_int_fields(self, "BLOCK_M", "BLOCK_N", "BLOCK_K", "STAGES", "GROUP_M", "STREAM_K")
        if self.BLOCK_M not in (64, 128, 192):
            raise ValueError(f"BLOCK_M={self.BLOCK_M}: expected 64 or 128 (one or two warpgroups) or 192 (128 + 64)")
        if self.BLOCK_N not in (64, 128, 192, 256):
            raise ValueError(f"BLOCK_N={self.BLOCK_N}: expected 64, 128 or 256 (the wgmma N width) or 192 (128 + 64)")
        if self.BLOCK_K not in (32, 64, 128):
            raise ValueError(f"BLOCK_K={self.BLOCK_K}: expected 32, 64 or 128")
        if self.STAGES < 2:
            raise ValueError(f"STAGES={self.STAGES}: expected >= 2")
        if self.GROUP_M < 1 or self.GROUP_M & (self.GROUP_M - 1):
            raise ValueError(f"GROUP_M={self.GROUP_M}: expected a power of two >= 1")
        if self.STREAM_K not in (0, 1, 2):
            raise ValueError(f"STREAM_K={self.STREAM_K}: expected 0, 1 or 2")
        for name in ("BLOCK_M", "BLOCK_N"):
            if getattr(self, name) == 192 and self.STREAM_K:
                raise ValueError(f"{name}=192 (two parts) runs whole tiles only: expected STREAM_K=0, got "
                                 f"STREAM_K={self.STREAM_K}")
        if self.BLOCK_M == 192 and self.BLOCK_N > 128:  # (also: at most one dimension in two parts)
            raise ValueError(f"BLOCK_M=192, BLOCK_N={self.BLOCK_N}: expected BLOCK_N 64 or 128 (a launch of 16 warps "
                             f"compiles with at most 128 registers per thread: ptxas cannot fit the wgmma of a 64 x "
                             f"{self.BLOCK_N} fp32 accumulator, {self.BLOCK_N // 2} registers per thread, in them)")
        if self.shared_bytes > SM90_MAX_SHARED_BYTES:
            raise ValueError(f"{self}: {self.shared_bytes} bytes of shared memory for STAGES x (BLOCK_M + BLOCK_N) x "
                             f"BLOCK_K ring and the C tile (sm_90 limit {SM90_MAX_SHARED_BYTES})")

    @property
    def num_warps(self) -> int:
        """Warps of the default (consumer) partition: one warpgroup per 64 rows of BLOCK_M's high part (BLOCK_M =
        192's low 64 rows have a worker partition of one warpgroup)."""
        return _runtime.m_parts(self.BLOCK_M)[0] // 16

    @property
    def shared_bytes(self) -> int:
        """Shared memory of the TMA ring, the C staging tile and the barriers."""
        return (self.STAGES * (self.BLOCK_M + self.BLOCK_N) * self.BLOCK_K + self.BLOCK_M * self.BLOCK_N) * 2 + \
            16 * self.STAGES


# gemm_fp16's table on a GPU, keyed on M, for N = 3072, K = 2048 on the H200; used for any N, K (correct
# everywhere, tuned only there). M <= 256: the Gluon swap-AB kernel (per-bucket winners of a CUPTI sweep; every
# winner has SPLIT_K = 1: the split-K reduction's serial tail cost ~1 us more than the extra SMs gained; 48 CTAs of
# BLOCK_N = 64 with a deep ring of 128-wide K tiles keep ~100 KB of B in flight per SM). Larger M: 128 x 256 TMA
# tiles in the stream-K kernel's whole-tile mode (STREAM_K=3: one flattened (tile, K) loop, so the next tile's
# loads overlap this tile's store). On a GPU, where they need no more waves of 132 SMs than 128 x 256 tiles, the
# persistent Gluon kernel's 128 x 192 whole tiles (16 column tiles of N = 3072) at M = 257-1024 (<= 128 tiles, one
# wave, against 96 tiles of 128 x 256 at M = 972), and its 192 x 128 whole tiles (two row parts; 24 column tiles)
# at M = 1409-2112 (<= 11 row tiles, <= 264 tiles: two waves, as the 128 x 256 tiles need there, of 0.75 the work
# each; M = 2053: 1.23x the 128 x 256 tiles, 1.07-1.18x the 128 x 192 ones at 1409-2048) and above 4096 (8192:
# 1% faster than 128 x 256, measured on an H100). docs/kernels.md and docs/benchmarks.md.
_TMA_LARGE = TmaConfig(128, 256, 64, SPLIT_K=1, num_warps=8, num_stages=4, GROUP_M=4, EPILOGUE_SUBTILE=2, STREAM_K=3)
_LARGEST_M = TmaConfig(128, 256, 64, SPLIT_K=1, num_warps=8, num_stages=3, GROUP_M=4, STREAM_K=3)
_P128x192 = PersistentConfig(BLOCK_M=128, BLOCK_N=192, BLOCK_K=32, STAGES=7, GROUP_M=8, STREAM_K=0)
_P192x128 = PersistentConfig(BLOCK_M=192, BLOCK_N=128, BLOCK_K=64, STAGES=4, GROUP_M=8, STREAM_K=0)
_G = GluonConfig
CONFIGS = ConfigTable(
    rows=(
        (1, GemvConfig(BLOCK_N=1, BLOCK_K=2048, num_warps=1)),
        (2, GemvConfig(BLOCK_N=2, BLOCK_K=1024, num_warps=1)),
        (8, _G(BLOCK_N=64, BLOCK_M=8, BLOCK_K=128, STAGES=10)),
        (16, _G(BLOCK_N=64, BLOCK_M=16, BLOCK_K=128, STAGES=7)),
        (32, _G(BLOCK_N=64, BLOCK_M=32, BLOCK_K=128, STAGES=8)),
        # one M tile; below 40 rows (more than 24 of the box's 64 past A's last row) 6 stages measured faster
        (39, _G(BLOCK_N=64, BLOCK_M=64, BLOCK_K=128, STAGES=6)),
        (64, _G(BLOCK_N=64, BLOCK_M=64, BLOCK_K=128, STAGES=7)),  # one M tile: a deeper ring
        (128, _G(BLOCK_N=64, BLOCK_M=64, BLOCK_K=128, STAGES=6)),
        (160, _G(BLOCK_N=64, BLOCK_M=80, BLOCK_K=128, STAGES=6)),  # two M tiles of 64 + 16 rows
        (192, _G(BLOCK_N=64, BLOCK_M=96, BLOCK_K=128, STAGES=5)),  # two M tiles of 64 + 32 rows
        (256, _G(BLOCK_N=64, BLOCK_M=128, BLOCK_K=64, STAGES=8)),
        (1024, _P128x192),
        (1408, _TMA_LARGE),
        (2112, _P192x128),
        (4096, _TMA_LARGE),
    ),
    larger=_P192x128,
)

# The table in the Triton CPU interpreter (no Gluon there): the ``tl`` paths, chosen on the H200 before the Gluon
# path existed (small M: pointer-load split-K; large M: the 128 x 256 TmaConfigs). Also correct on a GPU.
INTERPRETER_CONFIGS = ConfigTable(
    rows=(
        (16, SplitKConfig(16, 32, 128, SPLIT_K=4, num_warps=4, num_stages=4)),
        (32, SplitKConfig(32, 32, 128, SPLIT_K=4, num_warps=4, num_stages=4)),
        (64, SplitKConfig(64, 64, 128, SPLIT_K=2, num_warps=4, num_stages=4)),
        (128, SplitKConfig(128, 64, 128, SPLIT_K=2, num_warps=8, num_stages=4)),
        (192, SplitKConfig(64, 128, 64, SPLIT_K=1, num_warps=4, num_stages=4)),
        (256, SplitKConfig(64, 128, 64, SPLIT_K=1, num_warps=4, num_stages=4)),
        (4096, _TMA_LARGE),
    ),
    larger=_LARGEST_M,
)

# gemm_tma's defaults by M when the caller passes no config. NOT tuned for any workload except that the larger-M
# config is the fp16 N=3072/K=2048 large-M kernel; callers with a known shape (e.g. the NVFP4 linear's bf16
# N = K = 8192) pass their own TmaConfig per call.
TMA_CONFIGS = ConfigTable(
    rows=(
        (64, TmaConfig(64, 128, 128, SPLIT_K=4, num_warps=4, num_stages=4, PROGRAMS_PER_SM=2)),
        (256, TmaConfig(64, 128, 64, SPLIT_K=2, num_warps=4, num_stages=6, PROGRAMS_PER_SM=2)),
    ),
    larger=TmaConfig(128, 256, 64, SPLIT_K=1, num_warps=8, num_stages=3, GROUP_M=8),
)


def pick_config(M: int, N: int, K: int, interpreter: bool | None = None) -> (
        SplitKConfig | TmaConfig | GluonConfig | PersistentConfig | GemvConfig):
    """gemm_fp16's config for an [M, K] x [N, K]^T call: the ``CONFIGS`` entry for M on a GPU, the
    ``INTERPRETER_CONFIGS`` entry in the CPU interpreter (None means ``_runtime.interpreting()``). N and K do not
    change the choice.

    Raises:
        TypeError: M, N or K is not an int; interpreter not None or a bool. ValueError: M, N or K below 1
            (``gemm_fp16`` itself takes M = 0 and launches nothing)."""
    _runtime.check_ints(M=M, N=N, K=K)
    if interpreter is not None and not isinstance(interpreter, bool):
        raise TypeError(f"interpreter={interpreter!r}: expected None or a bool")
    if M < 1 or N < 1 or K < 1:
        raise ValueError(f"M={M}, N={N}, K={K}: expected ints >= 1")
    if interpreter is None:
        interpreter = _runtime.interpreting()
    return (INTERPRETER_CONFIGS if interpreter else CONFIGS).pick(M)


# ---------------------------------------------------------------------------------------------------------------
# Grid and stream-K schedule (host mirrors of the kernels' integer arithmetic)
# ---------------------------------------------------------------------------------------------------------------
def launch_programs(config: TmaConfig | PersistentConfig, M: int, N: int, K: int, num_sms: int) -> int:
    """Grid size of a TMA or persistent Gluon launch: min(work units, PROGRAMS_PER_SM x num_sms); work units are
    (tile, K slice) pairs, or for STREAM_K 1/2 (tile, K-iteration) pairs (so every program gets >= 1 iteration);
    TmaConfig STREAM_K 3 and PersistentConfig STREAM_K 0: tiles."""
    tiles = -(-M // config.BLOCK_M) * -(-N // config.BLOCK_N)
    units = tiles * (-(-K // config.BLOCK_K) if config.STREAM_K in (1, 2) else config.SPLIT_K)
    return min(units, num_sms * config.PROGRAMS_PER_SM)


def stream_k_schedule(config: TmaConfig | PersistentConfig, M: int, N: int, K: int, num_programs: int) -> dict:
    """Host mirror of the split points of gemm_fp16_tma_streamk_kernel and gemm_persistent_kernel (the same
    integer arithmetic).

    Returns dict(sk_tiles=tiles in the stream-K phase, dp_tiles=whole tiles of the data-parallel phase,
    max_pieces=most pieces of any one tile, max_piece_len=most products (K elements) in one piece of a split tile
    (K if none), split_tiles=stream-K tiles cut into >= 2 pieces, whole_tiles=tiles computed as one chain over
    all of K, pieces={tile: [(program, kt0, kt1), ...] in K order}) for the stream-K tiles.

    Raises:
        ValueError: ``config`` is not a stream-K TmaConfig or PersistentConfig; a size < 1.
        TypeError: a size that is not an int.
    """
    if not isinstance(config, (TmaConfig, PersistentConfig)) or not config.STREAM_K:
        raise ValueError(f"config={config}: not a stream-K config")
    _check_sizes(M=M, N=N, K=K, num_programs=num_programs)
    if min(M, N, K, num_programs) < 1:
        raise ValueError(f"M={M}, N={N}, K={K}, num_programs={num_programs}: expected all >= 1")
    tiles = -(-M // config.BLOCK_M) * -(-N // config.BLOCK_N)
    k_tiles = -(-K // config.BLOCK_K)
    G = num_programs
    sk_tiles = 0 if config.STREAM_K == 3 else tiles if config.STREAM_K == 1 or tiles <= G else tiles % G
    base, extra = divmod(sk_tiles * k_tiles, G)
    pieces: dict = {}
    for p in range(min(G, sk_tiles * k_tiles)):  # the programs past it own empty ranges
        it = p * base + min(p, extra)
        end = it + base + (p < extra)
        while it < end:
            t, kt0 = divmod(it, k_tiles)
            kt1 = min(k_tiles, kt0 + end - it)
            pieces.setdefault(t, []).append((p, kt0, kt1))
            it += kt1 - kt0
    BK = config.BLOCK_K
    lens = [min(k1 * BK, K) - k0 * BK for ps in pieces.values() if len(ps) > 1 for _, k0, k1 in ps]
    split = sum(len(ps) > 1 for ps in pieces.values())
    return dict(sk_tiles=sk_tiles, dp_tiles=tiles - sk_tiles, max_pieces=max((len(ps) for ps in pieces.values()),
                default=1), max_piece_len=max(lens, default=K), split_tiles=split,
                whole_tiles=tiles - split, pieces=pieces)  # fmt: skip


def _check_sizes(**sizes) -> None:
    """TypeError naming the first size that is not an int (None means not given)."""
    _runtime.check_ints(**{name: v for name, v in sizes.items() if v is not None})


# ---------------------------------------------------------------------------------------------------------------
# Numeric contract
# ---------------------------------------------------------------------------------------------------------------
def _dominating_model(inner: str, K: int, BK: int, max_len: int, pieces: int, whole: bool, fallback: str) -> str:
    """The tightest ``splitk(inner, C)`` (C a multiple of BK, or ``inner`` itself for C >= K) whose eps(K)
    bounds every tile of a stream-K launch: a split tile (<= ``pieces`` chains of <= ``max_len`` products, each
    bounded by inner, summed in fp32 RN: eps_in(max_len) + gamma_{pieces-1}(2^-24) (1 + eps_in(max_len)),
    Higham 2002 §3.1) and, when ``whole``, an unsplit tile (eps_in(K)). ``fallback`` when none does."""
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


def _grid_sms(interpreter: bool) -> int | None:
    """SMs the host launch sizes a grid for: INTERPRETER_SMS in the interpreter (CPU tensors), else the current
    CUDA device's count; None when there is no CUDA device to ask."""
    import torch

    if interpreter:
        return _runtime.INTERPRETER_SMS
    if not torch.cuda.is_available():
        return None
    return _runtime.num_sms(torch.device("cuda", torch.cuda.current_device()))


def accumulation_model(config: SplitKConfig | TmaConfig | GluonConfig | PersistentConfig | GemvConfig, K: int,
                       interpreter: bool = False, *,
                       inputs="float16", M: int | None = None, N: int | None = None,
                       num_programs: int | None = None) -> str:  # fmt: skip
    """The fp4ref.bounds accumulation model (a name for ``fp4ref.bounds.get_model``) of one config at this K.

    Per K slice of length L = ceil(ceil(K / BLOCK_K) / SPLIT_K) * BLOCK_K (clipped to K):

    * GPU, wgmma tiles (``config.uses_wgmma``): ``hopper_fp16_wgmma`` (block FMA, 16 products per step, F = 25,
      fp32 accumulator with RZ; docs/bounds.md).
    * GPU, tiles with BLOCK_M < 64 (Triton emits mma.sync, not wgmma): ``tc_fp32_universal`` (L * 2^-22, any
      fp32-accumulating tensor core): no bit-accurate model of Hopper's mma.sync path is established here.
    * CPU interpreter (``interpreter=True``): tl.dot is a numpy fp32 product, bounded by ``fp32_rn`` (gamma_L,
      any summation order; Higham 2002 §3.1).

    GluonConfig (GPU only): ``hopper_fp16_wgmma`` per slice of ``k_split(K)`` K tiles (all wgmma).
    GemvConfig (GPU and interpreter): ``fp32_rn``: exact fp16 x fp16 products summed in fp32 with RN, in a fixed
    order per config (gamma_K bounds any order).
    PersistentConfig (GPU only; ``interpreter`` is ignored): ``hopper_fp16_wgmma`` per piece, with the stream-K
    rule below.

    SPLIT_K > 1 wraps it as ``splitk(<model>, L)``: the partial sums are added in fp32 with RNE in the fixed order
    s = 0, 1, ..., SPLIT_K - 1 (fp4ref.bounds adds gamma_{ceil(K/L)-1}(2^-24)).

    ``inputs``: "float16" (default) or "bfloat16" (a dtype name or torch dtype; gemm_tma's bf16 operands): bf16
    wgmma is named ``hopper_bf16_wgmma``, the same fp4ref.bounds model as fp16.

    Stream-K configs (``STREAM_K`` 1, 2): the pieces depend on M, N and the grid. With ``M`` and ``N`` the answer
    is the tightest ``splitk(<model>, C)`` (or ``<model>``) bounding both the split tiles (<= P pieces of <= L
    products, ``stream_k_schedule``) and the whole ones, for the grid ``num_programs``; without
    ``num_programs`` the grid the host launch uses (``launch_programs`` with ``_runtime.num_sms`` of the current
    CUDA device, or ``_runtime.INTERPRETER_SMS`` when ``interpreter``). Without M and N (or without a CUDA device
    to size the grid) the answer bounds every schedule: ``fp32_rn`` in the interpreter, ``tc_fp32_universal`` on
    the GPU (K * 2^-22 covers any split of a linear bound plus the sums). STREAM_K 3: one chain per tile.

    Raises:
        ValueError: ``inputs`` not float16/bfloat16; K < 1.
        TypeError: ``config`` is not a SplitKConfig, TmaConfig, GluonConfig, PersistentConfig or GemvConfig; K,
            M, N or num_programs not an int.
    """
    if not isinstance(config, (SplitKConfig, TmaConfig, GluonConfig, PersistentConfig, GemvConfig)):
        raise TypeError(f"config: expected a SplitKConfig, TmaConfig, GluonConfig, PersistentConfig or GemvConfig, "
                        f"got {type(config).__name__}")
    _check_sizes(K=K, M=M, N=N, num_programs=num_programs)
    inputs = str(inputs).replace("torch.", "")
    if inputs not in ("float16", "bfloat16"):
        raise ValueError(f"inputs={inputs!r}: expected 'float16' or 'bfloat16'")
    if K < 1:
        raise ValueError(f"K={K}: expected >= 1")
    if isinstance(config, GemvConfig):  # CUDA-core FMAs (or numpy in the interpreter): fp32 RN, one chain per row
        return "fp32_rn"
    if isinstance(config, GluonConfig):  # wgmma in every slice; the slices are [s C, (s + 1) C) exactly
        per, slices = config.k_split(K)
        return "hopper_fp16_wgmma" if slices == 1 else f"splitk(hopper_fp16_wgmma, {min(K, per * config.BLOCK_K)})"
    if isinstance(config, PersistentConfig):  # Gluon: wgmma on the GPU, never interpreted
        inner, interpreter = "hopper_fp16_wgmma", False
    elif interpreter:
        inner = "fp32_rn"
    elif config.uses_wgmma:
        inner = "hopper_bf16_wgmma" if inputs == "bfloat16" else "hopper_fp16_wgmma"
    else:
        inner = "tc_fp32_universal"
    stream_k = getattr(config, "STREAM_K", 0)
    if stream_k:
        fallback = "fp32_rn" if interpreter else "tc_fp32_universal"
        if stream_k == 3:  # data-parallel only: one chain over all of K per tile
            return inner
        if M is None or N is None:
            return fallback
        if num_programs is None:
            sms = _grid_sms(interpreter)
            if sms is None:
                return fallback
            num_programs = launch_programs(config, M, N, K, sms)
        sch = stream_k_schedule(config, M, N, K, num_programs)
        return _dominating_model(inner, K, config.BLOCK_K, sch["max_piece_len"], sch["max_pieces"],
                                 sch["whole_tiles"] > 0, fallback)  # fmt: skip
    if isinstance(config, PersistentConfig):  # STREAM_K 0: one chain over all of K per tile
        return inner
    k_tiles = -(-K // config.BLOCK_K)
    L = min(K, -(-k_tiles // config.SPLIT_K) * config.BLOCK_K)
    return f"splitk({inner}, {L})" if L < K else inner


def _contract():
    from fp4ref.bounds import NumericContract

    return NumericContract(
        inputs="float16",
        output="float16",
        # One model for every config and K, on the GPU and in the interpreter: K * 2^-22 (any fp32-accumulating
        # tensor core; it also covers fp32 RN summation, gamma_K(2^-24) < K * 2^-22, and every split: splitting a
        # linear bound into chunks only lowers it). The tight per-config model is accumulation_model(config, K).
        model="tc_fp32_universal",
        model_interpreter="tc_fp32_universal",
        output_rounding="rne",  # one RNE from the fp32 accumulator to fp16 (cvt.rn.f16.f32; overflow -> +-inf)
        output_rounding_interpreter="rne",  # the interpreter's fp16 stores round correctly (docs/kernels.md)
        epilogue_multiplies=0,
        deterministic=True,
        config_model=accumulation_model,
        pick_config=pick_config,
        notes={
            "products": "exact: fp16 x fp16 has at most 22 significant bits",
            "split_k_reduction": "fp32 RNE partial sums in the fixed order s = 0, 1, ..., SPLIT_K - 1",
            "stream_k_reduction": "a split tile's pieces summed in K order (piece 0, 1, ...) in fp32 RNE by exactly "
                                  "one program",
        },
    )


NUMERIC_CONTRACT = _contract()
