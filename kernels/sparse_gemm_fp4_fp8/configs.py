"""Configs of sparse_gemm_fp4_fp8: one typed config per path, the table by M, and the numeric contract.

Five paths (the config's type says which one serves a call):

* ``GluonConfig`` (gluon.py, sm_90 only): swap-AB fp8 wgmma, b by TMA, the K slice's A decoded into shared
  memory while b streams in, promotion into fp32 overlapping the next wgmma, fixed-order split-K (through a
  workspace, or within a thread-block cluster); M = 3 .. 32 on a GPU.

* ``FusedConfig`` (fused.py): one launch; A is decoded from (vals, meta) inside the GEMM's K loop; split-K with a
  deterministic in-kernel reduction; the MMA engine is ``mma``: "fp8" (wgmma), "fp16" (tensor core) or "fma"
  (CUDA cores, GEMV-like M).
* ``ExpandConfig`` (expand.py): large M; a decode pre-pass writes the dense E4M3FN A to a workspace, then a
  persistent TMA fp8 wgmma GEMM (split_k 1): ``gemm="gluon"`` expand_gluon.py's warp-specialized kernel (sm_90),
  ``gemm="tl"`` expand.py's, then (``nan_fixup="launch"``) a NaN fix-up launch.

* ``FusedWSConfig`` (fused_gluon.py, sm_90, opt-in): one persistent warp-specialized launch; a decoder partition
  decodes each tile's A into shared memory; no dense-A workspace. Not in the table (slower on the H200).

* ``GemvConfig`` (gemv.py): CUDA cores, no tensor cores and no split-K; each program reads a few rows of b (as
  int32 words) and multiplies them by every row of A; M <= 2 on a GPU.

``CONFIGS`` picks by M (docs/kernels.md, "sparse_gemm_fp4_fp8"; the timings behind the picks are in
docs/benchmarks.md). ``accumulation_model(config, K)`` is the fp4ref.bounds model of one config;
``NUMERIC_CONTRACT.model`` bounds every config.
"""
from __future__ import annotations

from dataclasses import dataclass

from fp4ref.bounds import NumericContract

from .. import _runtime
from .._gluon import check_cluster, exchange_bytes
from .._sm90 import SM90_MAX_SHARED_BYTES

__all__ = ["CONFIGS", "ExpandConfig", "FALLBACK_CONFIG", "FusedConfig", "FusedWSConfig", "GemvConfig", "GluonConfig",
           "INTERPRETER_CONFIG",
           "MMA_KINDS", "NUMERIC_CONTRACT", "PROMOTION_INTERVAL", "TL_CONFIGS", "accumulation_model", "pick_config"]

PROMOTION_INTERVAL = 128  # most K-elements the fp8 wgmma accumulator (~14 bits) holds before the fp32 add

MMA_KINDS = {"fp16": 0, "fp8": 1, "fma": 2}  # FusedConfig.mma -> the fused kernel's MMA constexpr


@dataclass(frozen=True)
class FusedConfig:
    """One launch of the fused kernel (fused.py): tile [block_m, block_n], K-tiles of block_k, split_k K-slices.

    Raises:
        ValueError: ``mma`` not one of "fp8" (wgmma, block_m % 64 == 0), "fp16" (tensor core), "fma" (CUDA cores).
    """

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    mma: str = "fp8"

    def __post_init__(self):
        if self.mma not in MMA_KINDS:
            raise ValueError(f"mma={self.mma!r}: expected one of {tuple(MMA_KINDS)}")


@dataclass(frozen=True)
class ExpandConfig:
    """The expand path: decode pre-pass (expand.py), a persistent TMA fp8 wgmma GEMM (split_k 1), NaN fix-up.

    ``gemm``: the GEMM kernel. "tl": expand.py's ``sparse_gemm_expanded_kernel`` (each K tile's wgmma retired
    before its promotion). "gluon" (sm_90): expand_gluon.py's ``sparse_expanded_ws_kernel``, warp-specialized
    (a TMA producer warp, one or two consumer warpgroups: num_warps = block_m / 16), the promotion overlapping the
    next wgmma, a TMA-store epilogue; num_stages is its ring depth, block_k 128, n_split 1, programs_per_sm 1 and
    nan_fixup "inline" (it recomputes a NaN tile itself).
    ``programs_per_sm``: persistent programs per SM. ``n_split``: the C tile as n_split column blocks of
    block_n / n_split, each its own wgmma chain and fp32 accumulator (the promotion's fresh accumulator is then
    [block_m, block_n / n_split]: fewer registers). ``nan_fixup``: where a tile whose accumulator holds a NaN is
    recomputed by the exact slow path: "inline" (in the GEMM program; its registers then count for the whole
    kernel: 255 and spills at 128 x 128 for "tl") or "launch" (the GEMM flags the tile; a fix-up launch recomputes
    flagged tiles, ~2 us when none is flagged).

    Raises:
        ValueError: ``n_split`` not 1 or 2; ``nan_fixup`` not "inline" or "launch"; ``gemm`` not "tl" or "gluon";
            a "gluon" config outside the values above (block_m 64 or 128, block_n 64 or 128).
    """

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    programs_per_sm: int = 1
    n_split: int = 1
    nan_fixup: str = "launch"
    gemm: str = "tl"

    def __post_init__(self):
        if self.nan_fixup not in ("inline", "launch"):
            raise ValueError(f"nan_fixup={self.nan_fixup!r}: expected 'inline' or 'launch'")
        if self.n_split not in (1, 2):
            raise ValueError(f"n_split={self.n_split}: expected 1 or 2")
        if self.gemm not in ("tl", "gluon"):
            raise ValueError(f"gemm={self.gemm!r}: expected 'tl' or 'gluon'")
        if self.gemm == "gluon":
            _runtime.check_int_fields(self, "block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages")
            want = dict(block_k=PROMOTION_INTERVAL, n_split=1, programs_per_sm=1, nan_fixup="inline",
                        num_warps=self.block_m // 16)
            for name, value in want.items():
                if getattr(self, name) != value:
                    raise ValueError(f"{name}={getattr(self, name)!r}: gemm='gluon' needs {name}={value!r}")
            if self.block_m not in (64, 128) or self.block_n not in (64, 128):
                raise ValueError(f"block_m={self.block_m}, block_n={self.block_n}: gemm='gluon' takes 64 or 128 "
                                 "each (the fp32 accumulator and two fresh ones stay in registers)")
            if self.num_stages < 2 or self.group_m < 1:
                raise ValueError(f"num_stages={self.num_stages}, group_m={self.group_m}: gemm='gluon' needs >= 2 "
                                 "and >= 1")
            if self.shared_bytes > SM90_MAX_SHARED_BYTES:
                raise ValueError(f"{self}: {self.shared_bytes} bytes of shared memory (> 227 KiB)")

    @property
    def shared_bytes(self) -> int:
        """The "gluon" GEMM's shared memory in bytes: the ring (num_stages x (block_m + block_n) x 128 E4M3FN), the
        bf16 c tile of the TMA store and the barriers (the build adds a few hundred bytes of reduction scratch)."""
        return (self.num_stages * (self.block_m + self.block_n) * self.block_k + 2 * self.block_m * self.block_n
                + 16 * self.num_stages)


@dataclass(frozen=True)
class FusedWSConfig:
    """A launch of the fused Gluon kernel (``fused_gluon.sparse_fused_ws_kernel``; sm_90 only): persistent,
    warp-specialized, A decoded from (vals, meta) into shared memory by a decoder partition, K steps of 128.

    block_m: rows of c per tile: 64 (one wgmma M block; the decoded A tile serves every warpgroup).
    block_n: columns of c per tile: 128 or 256, split between the num_warps / 4 warpgroups (128 each).
    b_stages: depth of the b ring (b tile and A bytes per slot; >= 2).
    a_stages: depth of the decoded-A ring (2 .. b_stages).
    group_m: row tiles per group of the tile walk (b tiles shared in L2).
    num_warps: warps of the consumer partition: block_n / 32 (one warpgroup per 128 columns).

    ``tma_store``: the c tile goes out through shared memory by TMA where the rings leave room for it (else
    straight from registers). ``shared_bytes``: the rings, the c tile if any and the barriers.

    Raises:
        TypeError: a field that is not an int. ValueError: a value the kernel cannot take (listed above), or
            rings larger than the 227 KiB of shared memory of an sm_90 CTA.
    """

    block_m: int = 64
    block_n: int = 256
    b_stages: int = 4
    a_stages: int = 3
    group_m: int = 8
    num_warps: int = 8

    def __post_init__(self):
        _runtime.check_int_fields(self, "block_m", "block_n", "b_stages", "a_stages", "group_m", "num_warps")
        if self.block_m != 64:
            raise ValueError(f"block_m={self.block_m}: expected 64 (one wgmma M block)")
        if self.block_n not in (128, 256) or self.num_warps != self.block_n // 32:
            raise ValueError(f"block_n={self.block_n}, num_warps={self.num_warps}: expected block_n 128 or 256 and "
                             "num_warps = block_n / 32 (one warpgroup per 128 columns: the fp32 accumulator and two "
                             "fresh ones stay in registers)")
        if self.b_stages < 2 or not 2 <= self.a_stages <= self.b_stages or self.group_m < 1:
            raise ValueError(f"b_stages={self.b_stages}, a_stages={self.a_stages}, group_m={self.group_m}: "
                             "expected b_stages >= 2, 2 <= a_stages <= b_stages, group_m >= 1")
        if self._ring_bytes > SM90_MAX_SHARED_BYTES:
            raise ValueError(f"{self}: {self._ring_bytes} bytes of shared memory in the rings (> 227 KiB)")

    @property
    def _ring_bytes(self) -> int:
        return (self.b_stages * (self.block_n * PROMOTION_INTERVAL + self.block_m * 32 * 2)
                + self.a_stages * self.block_m * PROMOTION_INTERVAL + 40 * self.b_stages)

    @property
    def tma_store(self) -> bool:
        """Whether the bf16 c tile [block_m, block_n] fits beside the rings (then it is stored by TMA)."""
        return self._ring_bytes + 2 * self.block_m * self.block_n <= SM90_MAX_SHARED_BYTES - 1024

    @property
    def shared_bytes(self) -> int:
        """Shared memory in bytes: the b ring (num b_stages x (block_n x 128 b + block_m x 64 A bytes)), the
        decoded-A ring (a_stages x block_m x 128), the c tile when ``tma_store`` and the barriers (the build adds
        a few hundred bytes of reduction scratch)."""
        return self._ring_bytes + (2 * self.block_m * self.block_n if self.tma_store else 0)


@dataclass(frozen=True)
class GluonConfig:
    """A launch of the Gluon swap-AB kernel (``gluon.sparse_swapab_kernel``; sm_90 only). K steps of 128 (the
    promotion interval).

    BLOCK_N: rows of b (= columns of c) per CTA: 64 per warpgroup (64 with 4 warps; 128 with 4 or 8).
    BLOCK_M: the padded M (the wgmma N width): a power of two in 8..64; M > BLOCK_M runs ceil(M / BLOCK_M) M
        tiles, each re-reading b (mostly from L2).
    STAGES: depth of the TMA / mbarrier ring (>= 2).
    SPLIT_K: K slices per c tile; each covers ceil(K steps / SPLIT_K) steps (``k_split``), summed by the last
        arriving CTA in the fixed order s = 0, 1, ... (fp32 RN).
    num_warps: 4 (one warpgroup) or 8 (two warpgroups stacked along BLOCK_N).
    CLUSTER: the SPLIT_K slices of a c tile run as one thread-block cluster and are summed in the same order
        through distributed shared memory by its first CTA (kernels/_gluon.py ``cluster_sum``; same bits, no
        workspace). SPLIT_K must then be 2, 4 or 8 (a portable cluster of a power-of-two size) and the SPLIT_K - 1
        fp32 tiles the first CTA receives fit in 48 KiB (``_gluon.check_cluster``); at a K that gives fewer slices
        the workspace reduction runs instead (``cluster_size``; the same bits).

    Raises:
        TypeError: a field that is not an int. ValueError: a value the kernel cannot take, or more than 32 fp32
            accumulator registers per thread (the fp32 accumulator and two steps' wgmma results are live at once:
            64 per accumulator spilled in the sm_90 build).
    """

    BLOCK_N: int = 128
    BLOCK_M: int = 8
    STAGES: int = 4
    SPLIT_K: int = 1
    num_warps: int = 4
    CLUSTER: bool = False

    def __post_init__(self):
        _runtime.check_int_fields(self, "BLOCK_N", "BLOCK_M", "STAGES", "SPLIT_K", "num_warps")
        if not isinstance(self.CLUSTER, bool):
            raise TypeError(f"CLUSTER={self.CLUSTER!r}: expected a bool")
        if self.CLUSTER:
            check_cluster(self, self.BLOCK_N * self.BLOCK_M)
        if self.num_warps not in (4, 8):
            raise ValueError(f"num_warps={self.num_warps}: expected 4 or 8 (whole warpgroups)")
        if self.BLOCK_N not in (64, 128) or self.BLOCK_N < 16 * self.num_warps:
            raise ValueError(f"BLOCK_N={self.BLOCK_N}: expected 64 or 128 and >= 16 * num_warps")
        if self.BLOCK_M not in (8, 16, 32, 64):
            raise ValueError(f"BLOCK_M={self.BLOCK_M}: expected a power of two in 8..64 (the wgmma N width)")
        if self.STAGES < 2:
            raise ValueError(f"STAGES={self.STAGES}: expected >= 2")
        if self.SPLIT_K < 1:
            raise ValueError(f"SPLIT_K={self.SPLIT_K}: expected >= 1")
        acc_regs = self.BLOCK_N * self.BLOCK_M // (32 * self.num_warps)
        if acc_regs > 32:
            raise ValueError(f"{self}: {acc_regs} fp32 accumulator registers per thread, 3x live (> 32 spills)")

    def k_split(self, K: int) -> tuple[int, int]:
        """(K steps per slice, slices launched) at this K: the last slice may be shorter, none is empty."""
        return _runtime.k_split(-(-K // PROMOTION_INTERVAL), self.SPLIT_K)

    def shared_bytes(self, K: int) -> int:
        """Shared memory at reduction length K: the slice's A bytes and decoded A (K_PER x BLOCK_M x (64 + 128)),
        the b ring (STAGES x BLOCK_N x 128) and, in a cluster, the exchange buffer (kernels/_gluon.py
        ``exchange_bytes``)."""
        per, _ = self.k_split(K)
        return (per * self.BLOCK_M * 192 + self.STAGES * self.BLOCK_N * PROMOTION_INTERVAL + 8 * (self.STAGES + 1)
                + exchange_bytes(self.BLOCK_N * self.BLOCK_M, self.cluster_size(K)))

    def cluster_size(self, K: int) -> int:
        """CTAs per thread-block cluster at reduction length K: SPLIT_K with CLUSTER where K gives SPLIT_K slices,
        else 1 (no cluster: the workspace reduction, which adds the slices in the same order)."""
        return self.SPLIT_K if self.CLUSTER and self.k_split(K)[1] == self.SPLIT_K else 1

    def fits(self, K: int) -> bool:
        """Whether the kernel takes reduction length K: whole 128-K steps (the TMA boxes of A's bytes and b) and
        at most 200 KiB of shared memory (``shared_bytes``; the sm_90 limit is 227 KiB)."""
        return K % PROMOTION_INTERVAL == 0 and self.shared_bytes(K) <= 200 * 1024


@dataclass(frozen=True)
class GemvConfig:
    """A launch of the GEMV kernel (``gemv.sparse_gemv_kernel``): CUDA cores, every row of A per program, no
    split-K; ceil(N / block_n) programs.

    block_n: rows of b per program: a power of two in 1..64.
    block_g: groups of 4 K-columns per chunk (the loads of one chunk fly while the previous one is multiplied): a
        power of two in 16..512.
    num_warps: 1, 2, 4 or 8.

    ``max_m``: the most rows of A a call may have: the per-lane fp32 partial sums [M padded to a power of two,
    block_n, block_g] take at most 32 registers per thread (the sm_90 build of 4 x 128 x 4 warps spills at 64).

    Raises:
        TypeError: a field that is not an int. ValueError: a value outside the ranges above, or a tile whose
            partial sums take more than 64 registers per thread even at M = 1.
    """

    block_n: int = 4
    block_g: int = 128
    num_warps: int = 4

    def __post_init__(self):
        _runtime.check_int_fields(self, "block_n", "block_g", "num_warps")
        if self.block_n not in (1, 2, 4, 8, 16, 32, 64):
            raise ValueError(f"block_n={self.block_n}: expected a power of two in 1..64")
        if self.block_g not in (16, 32, 64, 128, 256, 512):
            raise ValueError(f"block_g={self.block_g}: expected a power of two in 16..512")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"num_warps={self.num_warps}: expected 1, 2, 4 or 8")
        if self.max_m < 1:
            raise ValueError(f"{self}: block_n x block_g = {self.block_n * self.block_g} fp32 partial sums take "
                             f"more than 32 registers per thread with {self.num_warps} warps")

    @property
    def max_m(self) -> int:
        """The most rows of A (a power of two, 0 when even one row does not fit)."""
        rows = 32 * 32 * self.num_warps // (self.block_n * self.block_g)
        return 1 << (rows.bit_length() - 1) if rows >= 1 else 0


# The `tl` paths' table on a GPU (where the Gluon path does not fit a call, e.g. K % 128 != 0 or operands its TMA
# descriptors cannot read). Picked per M by the H200 sweep (python -m fp4ref.kernels.bench sparse_gemm_fp4_fp8
# --sweep --check), which ranks by GPU time and, at M <= 256, takes the expand path only where its event time
# (host included) is also lower. fp8 wgmma needs block_m % 64 == 0 and num_warps % 4 == 0.
TL_CONFIGS = _runtime.ConfigTable(
    rows=(
        (1, FusedConfig(1, 32, 128, split_k=8, num_warps=2, num_stages=3, mma="fma")),
        (16, FusedConfig(16, 64, 128, split_k=8, num_warps=4, num_stages=3, mma="fp16")),
        (64, FusedConfig(64, 64, 128, split_k=8, num_warps=4, num_stages=3)),
        (256, ExpandConfig(64, 64, 128, num_warps=4, num_stages=4, nan_fixup="inline")),
        (1024, ExpandConfig(128, 128, 128, group_m=16, num_warps=8, num_stages=4)),
    ),
    larger=ExpandConfig(128, 256, 128, group_m=16, num_warps=8, num_stages=3, n_split=2),
)

# The table on a GPU: the GEMV path at M <= 2 (of eight GEMV configs in a same-run H200 comparison: 4 rows of b
# per program and 128-group chunks at M = 1, 4.96 us; 8 rows and 256-group chunks at M = 2, 5.47 us; against 6.38 /
# 6.30 for the Gluon row and 4.99 / 4.90 for cuBLAS fp8; 8 x 256 at M = 1, 4.83 us, spills one register in the
# sm_90 build; from M = 4 the Gluon path is faster), then
# the Gluon kernel where it is the fastest path (M <= 32; per-bucket winners of H200 CUPTI sweeps, N = K = 2048:
# BLOCK_N = 64 and 4 K slices put 128 CTAs on the 132 SMs; STAGES = steps per slice + 1 issues every b tile of a
# slice at once; at M = 3-8 the slices of a tile run as one cluster, summed through distributed shared memory:
# 5.3-5.5 us against 5.8-6.1 for the workspace reduction in the same run; at M = 9-16 128 columns, 4 slices in a
# cluster, 5.6-5.7 us against 6.0-6.3 for 64 columns with the workspace; at M = 17-32 two 16-row M tiles of 64
# columns, 2 slices in a cluster, 6.8-6.9 us against 6.9-7.2 for 128 columns with the workspace), then the
# expand path with the Gluon GEMM (the least GPU time per M in `--sweep --paths expand` and in same-run
# comparisons: 64 x 64 to 256, 64 x 128 at 512, 128 x 128 above; at M = 33 .. 64 it took 7.5 us against 7.9-10.8
# for the swap-AB kernel, whose per-N-tile decode of A grows with M, and won on event time too).
# docs/benchmarks.md.
def _gluon_gemm(block_m, block_n, stages, group_m=8):
    """The expand path with the Gluon GEMM (expand_gluon.py)."""
    return ExpandConfig(block_m, block_n, PROMOTION_INTERVAL, group_m=group_m, num_warps=block_m // 16,
                        num_stages=stages, nan_fixup="inline", gemm="gluon")


CONFIGS = _runtime.ConfigTable(
    rows=(
        (1, GemvConfig(block_n=4, block_g=128, num_warps=4)),
        (2, GemvConfig(block_n=8, block_g=256, num_warps=4)),
        (8, GluonConfig(BLOCK_N=64, BLOCK_M=8, STAGES=5, SPLIT_K=4, CLUSTER=True)),
        (16, GluonConfig(BLOCK_N=128, BLOCK_M=16, STAGES=5, SPLIT_K=4, CLUSTER=True)),
        (32, GluonConfig(BLOCK_N=64, BLOCK_M=16, STAGES=5, SPLIT_K=2, CLUSTER=True)),
        (256, _gluon_gemm(64, 64, 8)),
        (512, _gluon_gemm(64, 128, 6)),
    ),
    larger=_gluon_gemm(128, 128, 5),
)

# Large M when b_fp8 cannot feed TMA descriptors (the host's tma_eligible): the fused kernel's large-M pick.
FALLBACK_CONFIG = FusedConfig(64, 128, 128, split_k=1, num_warps=4, num_stages=4)

# Small tiles for the CPU interpreter (cost ~ programs x K-steps there). Not used on a GPU.
INTERPRETER_CONFIG = FusedConfig(64, 64, 128, split_k=2, num_warps=4, num_stages=1)


def pick_config(M: int, N: int, K: int, interpreter: bool | None = None):
    """The config a call with M rows runs: ``INTERPRETER_CONFIG`` in the CPU interpreter, else ``CONFIGS.pick(M)``.

    ``interpreter``: None means ``_runtime.interpreting()``. TypeError / ValueError unless M, N >= 1 and K a
    positive multiple of 4 (ints). N and K do not change the pick (the table is tuned for
    the workload's N = K = 2048) except that a GluonConfig which does not fit K, or a Gluon-GEMM ExpandConfig at
    K % 128 != 0, gives way to the ``TL_CONFIGS`` row. The host also takes the ``TL_CONFIGS`` row where the
    operands' strides or alignment (or, for the Gluon GEMM, the output's) do not fit the Gluon kernels' TMA
    descriptors, and ``FALLBACK_CONFIG`` instead of an ExpandConfig where b_fp8 cannot feed them.
    """
    _runtime.check_ints(M=M, N=N, K=K)
    if M < 1 or N < 1 or K < 4 or K % 4:
        raise ValueError(f"M={M}, N={N}, K={K}: expected M, N >= 1 and K a positive multiple of 4")
    if interpreter is None:
        interpreter = _runtime.interpreting()
    if interpreter:
        return INTERPRETER_CONFIG
    cfg = CONFIGS.pick(M)
    if isinstance(cfg, GluonConfig) and not cfg.fits(K):
        cfg = TL_CONFIGS.pick(M)
    if isinstance(cfg, ExpandConfig) and cfg.gemm == "gluon" and K % cfg.block_k != 0:
        cfg = TL_CONFIGS.pick(M)
    if isinstance(cfg, FusedWSConfig) and K % PROMOTION_INTERVAL != 0:
        cfg = TL_CONFIGS.pick(M)
    return cfg


def accumulation_model(config, K: int, interpreter: bool = False, **launch) -> str:
    """The tightest fp4ref.bounds model name for ``config`` at reduction length K (GPU and interpreter alike).

    fp8 configs (every ExpandConfig, FusedConfig with mma "fp8"): ``hopper_fp8_wgmma_promote(block_k)``;
    GluonConfig: ``hopper_fp8_wgmma_promote(128)`` (its NaN recompute path sums exact products in fp32, within it).
    GemvConfig: ``fp32_rn`` (exact products summed in fp32, RN, in a fixed order). fp16
    configs: each K slice (the K-tiles one program owns, length <= ceil(K/block_k/split_k)*block_k) accumulates in
    fp32 on the tensor core (wgmma when block_m >= 64, otherwise mma.sync, bounded by the universal fp32
    tensor-core model), then the split_k partials are summed in fp32: ``splitk(<model>, slice)``. fma configs:
    ``fp32_rn`` per slice. Every one is within ``NUMERIC_CONTRACT.model``. The interpreter's fp32 products and
    sums meet the same models. ``launch`` (M, N) is accepted and not needed.

    Raises:
        TypeError: ``config`` is not a GemvConfig, GluonConfig, FusedWSConfig, FusedConfig or ExpandConfig.
    """
    if isinstance(config, GemvConfig):
        return "fp32_rn"  # exact products, fp32 RN sums in a fixed order
    if isinstance(config, (GluonConfig, FusedWSConfig)):
        return f"hopper_fp8_wgmma_promote({PROMOTION_INTERVAL})"
    if isinstance(config, ExpandConfig):
        return f"hopper_fp8_wgmma_promote({config.block_k})"
    if not isinstance(config, FusedConfig):
        raise TypeError(f"config: expected a GemvConfig, GluonConfig, FusedWSConfig, FusedConfig or ExpandConfig, "
                        f"got {type(config).__name__}")
    if config.mma == "fp8":
        return f"hopper_fp8_wgmma_promote({config.block_k})"
    if config.mma == "fma":
        inner = "fp32_rn"  # exact products, fp32 RN sums in a fixed order
    else:
        inner = "hopper_fp16_wgmma" if config.block_m >= 64 else "tc_fp32_universal"
    k_tiles = -(-K // config.block_k)
    split = max(1, min(config.split_k, k_tiles))
    chunk = min(K, -(-k_tiles // split) * config.block_k)
    return f"splitk({inner}, {chunk})" if split > 1 else inner


# fp8 wgmma whose accumulator is added into fp32 every <= 128 K-elements bounds EVERY config; the K/BLOCK_K fp32
# chunk sums (promotions and the split-K partials, in any fixed order) are the gamma_{K/128}(2^-24) term of it.
_CONTRACT_MODEL = f"hopper_fp8_wgmma_promote({PROMOTION_INTERVAL})"

NUMERIC_CONTRACT = NumericContract(
    inputs="E2M1 (2:4 sparse, decoded exactly to E4M3FN) x E4M3FN",
    output="bfloat16",
    model=_CONTRACT_MODEL,
    model_interpreter=_CONTRACT_MODEL,
    output_rounding="rne",  # fp32 -> bf16 once (GPU)
    output_rounding_interpreter="faithful",  # interpreted fp32 -> bf16 stores truncate (docs/kernels.md)
    epilogue_multiplies=0,
    deterministic=True,  # bitwise, run to run (fixed reduction order, no float atomics)
    config_model=accumulation_model,
    pick_config=pick_config,
    notes={
        "products": "exact (E2M1 x E4M3FN has <= 6 significant bits)",
        "split_k_reduction": "fp32_rn_fixed_order (partials summed in split order 0..SPLIT_K-1)",
        "nan": "NaN iff a selected b position holds an E4M3FN NaN byte",
    },
)
