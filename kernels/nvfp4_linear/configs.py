"""Configs of nvfp4_linear: one typed config per path, the table that picks one by M, the numeric contract.

Paths (the config's type says which one serves a call):

* ``GemvConfig``: ``nvfp4_gemv_kernel`` (gemv.py), CUDA cores, batch-1 decode.
* ``TensorCoreConfig``: ``nvfp4_linear_kernel`` (tensorcore.py), W decoded in registers, tensor cores, split-K.
* ``PrepassConfig``: the large-M path of the CPU interpreter and of shapes the Gluon path cannot take (prepass.py):
  W decoded to an fp16 workspace, then gemm_fp16's TMA GEMM.

``QuantizeConfig`` is the tile of the quantizer that runs before every path (and in ``nvfp4_quantize``).
Workload: SOL-ExecBench ``nvfp4_linear_layer`` (in = out = 8192); docs/kernels.md, section nvfp4_linear.
"""
from __future__ import annotations

from dataclasses import dataclass

import triton

from fp4ref.bounds import NumericContract

from .._gluon import check_cluster, exchange_bytes
from .._runtime import ConfigTable, check_ints, check_tile_width, interpreting
from ..gemm_fp16 import TmaConfig

__all__ = [
    "CLUSTER_CTAS", "CLUSTER_TILE_C", "CLUSTER_WARPS", "CONFIGS", "Dp4aConfig", "GRID_SYNC_MAX_WARPS", "GemvConfig",
    "GluonConfig", "INTERPRETER_CONFIGS",
    "NUMERIC_CONTRACT", "PREPASS_MODES", "PrepassConfig", "QUANTIZE_AMAX_FORMS", "QUANTIZE_CONFIGS", "QuantizeConfig",
    "READ_ALL_MAX_ELEMENTS", "READ_ALL_TILE_C", "READ_ALL_TILE_ELEMENTS", "READ_ALL_WARPS", "RECIPE",
    "TensorCoreConfig", "accumulation_model", "block_k_for", "cluster_config", "grid_sync_config", "pick_config",
    "pick_quantize_config", "read_all_config",
]

RECIPE = "sol"  # fp4ref.blockscale.nvfp4_quantize(x, recipe="sol") bytes, for every finite input


def _check_pow2(cfg, *names):
    for name in names:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}={v!r}: expected an int (a power of two >= 1), got {type(v).__name__}")
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name}={v!r}: expected a power of two >= 1")


def _check_sizes(M, K) -> None:
    """x [M, K] of the quantizer: ints, M >= 1, K a positive multiple of 16 (TypeError / ValueError naming them)."""
    check_ints(M=M, K=K)
    if M < 1 or K < 16 or K % 16:
        raise ValueError(f"M={M}, K={K}: expected M >= 1 and K a positive multiple of 16")


def _check_positive(cfg, *names, minimum: int = 1):
    for name in names:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}={v!r}: expected an int >= {minimum}, got {type(v).__name__}")
        if v < minimum:
            raise ValueError(f"{name}={v!r}: expected an int >= {minimum}")


def _steps_split_evenly(K: int, split_k: int) -> bool:
    """K is whole 256-element steps (the Gluon and DP4A paths' ring slot) and SPLIT_K divides their number."""
    return K % 256 == 0 and (K // 256) % split_k == 0


@dataclass(frozen=True)
class GemvConfig:
    """The CUDA-core GEMV (``nvfp4_gemv_kernel``): BLOCK_N weight rows x BLOCK_K columns per step, BLOCK_M rows
    of x per program (1-4: the rows share each decoded weight element: one decode + BLOCK_M FMAs), SPLIT_K
    programs along K (fixed-order last-arrival sum), num_warps, num_stages (1: no software pipelining)."""

    BLOCK_N: int
    BLOCK_M: int
    BLOCK_K: int  # >= 16
    SPLIT_K: int
    num_warps: int
    num_stages: int = 1

    def __post_init__(self):
        _check_pow2(self, "BLOCK_N", "BLOCK_K", "num_warps")
        _check_positive(self, "SPLIT_K", "num_stages")
        if self.BLOCK_M not in (1, 2, 3, 4):
            raise ValueError(f"BLOCK_M={self.BLOCK_M!r}: expected 1, 2, 3 or 4")
        if self.BLOCK_K < 16:
            raise ValueError(f"BLOCK_K={self.BLOCK_K}: expected >= 16 (one NVFP4 block)")


@dataclass(frozen=True)
class TensorCoreConfig:
    """The in-kernel decode path (``nvfp4_linear_kernel``, swap AB: MMA rows = weight rows N, MMA columns = x
    rows M)."""

    BLOCK_N: int  # weight rows per program (wgmma M dimension; multiple of 64 for wgmma)
    BLOCK_M: int  # x rows per program (wgmma N dimension; >= 16)
    BLOCK_K: int  # K per step (multiple of 32: two E2M1 per byte, 16-element blocks)
    SPLIT_K: int  # programs along K; > 1: fp32 partials, summed by the tile's last program (fixed order)
    num_warps: int
    num_stages: int
    # block scales as int32 words (used where K % 64 == 0): bitwise equal on the H200, 0.77-1.02x the byte loads
    SCALE_WORDS: bool = False
    # decode by bit placement + an f16x2 multiply instead of cvt e4m3x2 (decode.DECODE_BITS_PTX)
    DECODE_BITS: bool = False

    def __post_init__(self):
        _check_pow2(self, "BLOCK_N", "BLOCK_M", "BLOCK_K", "num_warps")
        _check_positive(self, "SPLIT_K", "num_stages")


@dataclass(frozen=True)
class GluonConfig:
    """The Gluon path (``gluon.nvfp4_gluon_kernel``, sm_90 only): W decoded in registers straight into the wgmma
    A operand, swap-AB; BN weight rows per program (64 per warpgroup: num_warps 4 -> 64, 8 -> 128), BM rows of x
    per program (the wgmma N width: a power of two in 8..256, or the sum of two such, 48, 80, 96, 160, 192, ...,
    at most 256, run as two wgmmas per decoded A fragment; such a BM needs SPLIT_K 1), SPLIT_K programs along K
    (fixed-order last-arrival sum). TMA rings:
    STAGES 256-element K steps of W codes and scales; x rides in that ring ([BM, 256] per step, X_STAGES 0) or has
    its own ring of X_STAGES >= 2 64-element chunks (large tiles, where STAGES steps of x would not fit in shared
    memory). W_SWIZZLE: the W codes' TMA uses the 128-byte swizzle (no bank conflicts on the decode's 16-byte
    loads). EARLY_START: under nvfp4_linear the kernel is launched with programmatic dependent launch, and the
    quantizer lets it start when the quantizer starts (True: its W prologue loads run under the quantizer) or only
    after the quantizer's stores (False). CLUSTER: the SPLIT_K slices of a tile run as one thread-block cluster
    and are summed in the same order through distributed shared memory (kernels/_gluon.py ``cluster_sum``: the
    same bits, no workspace); SPLIT_K 2, 4 or 8, the SPLIT_K - 1 fp32 tiles the first CTA receives within 48 KiB
    (``_gluon.check_cluster``). Needs K % 256 == 0 and (K / 256) % SPLIT_K == 0 (``fits``).

    Raises:
        TypeError: a size that is not an int (bools are not), W_SWIZZLE, EARLY_START or CLUSTER not a bool.
            ValueError: BN not 16 * num_warps (num_warps 4 or 8), BM not a power of two in 8..256 or the sum of two
            such, a two-part BM with SPLIT_K > 1, SPLIT_K not a power of two, STAGES < 2, X_STAGES 1 or negative,
            CLUSTER with SPLIT_K not 2, 4 or 8, a tile too large to exchange or more than 227 KiB of shared memory
            with the exchange buffer."""

    BN: int
    BM: int
    SPLIT_K: int
    STAGES: int
    W_SWIZZLE: bool = True
    num_warps: int = 4
    X_STAGES: int = 0
    EARLY_START: bool = True
    CLUSTER: bool = False

    def __post_init__(self):
        check_ints(BN=self.BN, BM=self.BM, num_warps=self.num_warps, X_STAGES=self.X_STAGES)
        _check_pow2(self, "SPLIT_K")
        _check_positive(self, "STAGES", minimum=2)
        if self.num_warps not in (4, 8) or self.BN != 16 * self.num_warps:
            raise ValueError(f"BN={self.BN!r}, num_warps={self.num_warps!r}: expected num_warps 4 or 8 and "
                             "BN = 16 * num_warps (64 rows per warpgroup)")
        _hi, lo = check_tile_width("BM", self.BM)
        if lo and self.SPLIT_K != 1:
            raise ValueError(f"BM={self.BM} (two wgmma parts): expected SPLIT_K=1, got {self.SPLIT_K}")
        for name in ("W_SWIZZLE", "EARLY_START", "CLUSTER"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}={getattr(self, name)!r}: expected a bool")
        if self.X_STAGES < 0 or self.X_STAGES == 1:
            raise ValueError(f"X_STAGES={self.X_STAGES!r}: expected 0 (x in the W ring) or an int >= 2")
        if self.CLUSTER:  # the exchange buffer comes on top of the rings
            check_cluster(self, self.BN * self.BM, self.shared_bytes)

    @property
    def cluster_size(self) -> int:
        """CTAs per thread-block cluster: SPLIT_K with CLUSTER, else 1 (every K the config ``fits`` splits evenly,
        so it does not depend on K)."""
        return self.SPLIT_K if self.CLUSTER else 1

    @property
    def shared_bytes(self) -> int:
        """Shared memory in bytes: the W ring (STAGES x BN x (128 code + 16 scale bytes)), x (STAGES x BM x 256
        fp16 in that ring, or X_STAGES x BM x 64 in its own), the barriers and, with CLUSTER, the exchange buffer
        (kernels/_gluon.py ``exchange_bytes``)."""
        x = (self.STAGES * 256 if self.X_STAGES == 0 else self.X_STAGES * 64) * self.BM * 2
        return (self.STAGES * self.BN * 144 + x + 8 * (self.STAGES + self.X_STAGES)
                + exchange_bytes(self.BN * self.BM, self.cluster_size))

    def fits(self, N: int, K: int) -> bool:
        """Whether this config can run x [M, K] times W [N, K]: 256-element K steps split evenly."""
        return _steps_split_evenly(K, self.SPLIT_K)


@dataclass(frozen=True)
class Dp4aConfig:
    """The DP4A path (``dp4a.nvfp4_dp4a_kernel``, sm_90): integer dot products of the doubled E2M1 codes of W and
    x on the CUDA cores (dp4a), one exact fp32 term per 16-element block. BN weight rows per program (a multiple of
    4 num_warps: each thread owns BN / (4 num_warps) rows; num_warps 4 or 8 consumer warps, plus one TMA producer
    warp), BM rows of x per program (1, 2, 4 or 8), SPLIT_K programs along K (fixed-order last-arrival sum), a TMA
    ring of STAGES 256-element K steps (W codes and scales, x codes and scales). EARLY_START as GluonConfig's.
    Needs K % 256 == 0 and (K / 256) % SPLIT_K == 0 (``fits``).

    Raises:
        ValueError: a size that is not a power of two, BM not 1/2/4/8, num_warps not 4 or 8, BN not a multiple of
            4 num_warps, STAGES < 2. TypeError: a size that is not an int, EARLY_START not a bool."""

    BN: int = 64
    BM: int = 1
    SPLIT_K: int = 4
    STAGES: int = 4
    num_warps: int = 4
    EARLY_START: bool = True

    def __post_init__(self):
        check_ints(BM=self.BM)
        _check_pow2(self, "BN", "SPLIT_K", "num_warps")
        _check_positive(self, "STAGES", minimum=2)
        if self.BM not in (1, 2, 4, 8):
            raise ValueError(f"BM={self.BM!r}: expected 1, 2, 4 or 8")
        if self.num_warps not in (4, 8) or self.BN % (4 * self.num_warps):
            raise ValueError(f"BN={self.BN}, num_warps={self.num_warps}: expected num_warps 4 or 8 (whole warpgroups "
                             "beside the producer warp) and BN a multiple of 4 * num_warps")
        if not isinstance(self.EARLY_START, bool):
            raise TypeError(f"EARLY_START={self.EARLY_START!r}: expected a bool")

    def fits(self, N: int, K: int) -> bool:
        """Whether this config can run x [M, K] times W [N, K]: 256-element K steps split evenly."""
        return _steps_split_evenly(K, self.SPLIT_K)


PREPASS_MODES = ("fp32", "cvt")


@dataclass(frozen=True)
class PrepassConfig:
    """The large-M path: W decoded per call to an fp16 workspace [N, K] (2 N K bytes) by a [BLOCK_R, BLOCK_C]
    tile pre-pass with ``num_warps``, then gemm_fp16.gemm_tma with ``gemm`` (a TmaConfig) and the fp32 epilogue
    scale.

    ``mode`` "fp32": ``nvfp4_decode_weight_kernel`` (byte loads, fp32 value x fp32 scale, converted); "cvt":
    ``nvfp4_decode_weight_words_kernel`` (32-bit code words, the in-kernel path's cvt.rn.f16x2.e4m3x2 decode,
    8 consecutive fp16 per word: 16-byte stores; BLOCK_C narrowed to a power of two dividing K)."""

    gemm: TmaConfig
    BLOCK_R: int = 16
    BLOCK_C: int = 512  # multiple of 32
    num_warps: int = 4
    mode: str = "fp32"

    def __post_init__(self):
        _check_pow2(self, "BLOCK_R", "BLOCK_C", "num_warps")
        if self.mode not in PREPASS_MODES:
            raise ValueError(f"mode={self.mode!r}: expected one of {PREPASS_MODES}")


QUANTIZE_AMAX_FORMS = ("launch", "grid_sync", "read_all", "cluster")


@dataclass(frozen=True)
class QuantizeConfig:
    """The quantizer's tile: BLOCK_R rows x BLOCK_C columns per program, num_warps, and how the programs get the
    global amax (``AMAX``; quantize.py):

    * "launch": two launches, ``amax_kernel``'s partials, then the tiles. ``pick_quantize_config`` caps BLOCK_C
      at K's next power of two (BLOCK_R grows to keep the tile's element count) and BLOCK_R at M's.
    * "grid_sync": one cooperative launch whose programs meet at a grid barrier; CUDA only (not the CPU
      interpreter), the grid at most the device's SM count (``grid_sync_config``).
    * "read_all": one launch; every program reads all of x (at most READ_ALL_MAX_ELEMENTS elements, padded to
      powers of two) for the amax, then quantizes its tile (``read_all_config``).
    * "cluster": one launch of CLUSTER_CTAS programs that form one thread-block cluster and exchange their tile
      maxima through distributed shared memory; sm_90 and later, not the CPU interpreter (``cluster_config``).

    Raises:
        ValueError: a size that is not a power of two; AMAX not one of QUANTIZE_AMAX_FORMS."""

    BLOCK_R: int
    BLOCK_C: int  # multiple of 16
    num_warps: int
    AMAX: str = "launch"

    def __post_init__(self):
        _check_pow2(self, "BLOCK_R", "BLOCK_C", "num_warps")
        if self.BLOCK_C < 16 or self.num_warps > 32:
            raise ValueError(f"BLOCK_C={self.BLOCK_C}, num_warps={self.num_warps}: expected BLOCK_C >= 16 (whole "
                             "16-element blocks) and at most 32 warps")
        if not isinstance(self.AMAX, str) or self.AMAX not in QUANTIZE_AMAX_FORMS:
            raise ValueError(f"AMAX={self.AMAX!r}: expected one of {QUANTIZE_AMAX_FORMS}")


# On a GPU, chosen by M (rows of x). M = 1: the DP4A path (integer block dot products on the CUDA cores: no
# decode to fp16, no wgmma chain; 128 weight rows x 2 K halves = 128 programs of 8 consumer warps; at M = 2 the
# Gluon row below measured 19.7-19.8 us against 20.1-21.4 for it, at M = 1 19.7 against 19.6). M <= 256: the
# Gluon path, per-bucket winners of an H200 CUPTI sweep of the kernel (docs/benchmarks.md): bound by the weight
# bytes (36 MiB) and the decode, so every program streams W with a deep TMA ring, split-K where the grid would
# otherwise underfill the SMs; at M = 2..16 the two K slices of a tile run as one thread-block cluster and are
# summed in the first CTA's shared memory (CLUSTER: 0.4-0.7 us less per call than the workspace reduction in one
# run, with the first form of the exchange; M = 8 20.3 us with the present one against 21.0-21.3 before; with the
# quantizer's cluster form, 5 stages at M = 9..16: 20.6-21.1 us against 21.1-21.2 for 6).
# Larger M is bound by tensor-core throughput: 128 weight rows x 256 rows of x per program (two warpgroups), x in its
# own ring of 64-K chunks, no workspace. The GEMM starts under the quantizer (EARLY_START); with the workspace
# reduction that measured 11-14% slower at M = 9..16 than starting after the quantizer's stores, with the cluster's it
# is the faster of the two (docs/benchmarks.md). Shapes the Gluon path cannot take (``GluonConfig.fits``) use
# INTERPRETER_CONFIGS.
_X256_W64 = GluonConfig(BN=64, BM=256, SPLIT_K=1, STAGES=3, X_STAGES=6)  # 256 rows of x, 64 of W per program
_X256_W128 = GluonConfig(BN=128, BM=256, SPLIT_K=1, STAGES=2, num_warps=8, X_STAGES=4)  # 128 of W, two warpgroups
CONFIGS = ConfigTable(
    rows=(
        (1, Dp4aConfig(BN=128, BM=1, SPLIT_K=2, STAGES=4, num_warps=8)),
        (8, GluonConfig(BN=64, BM=8, SPLIT_K=2, STAGES=6, CLUSTER=True)),
        (16, GluonConfig(BN=64, BM=16, SPLIT_K=2, STAGES=5, CLUSTER=True)),
        (32, GluonConfig(BN=64, BM=32, SPLIT_K=2, STAGES=4)),
        (64, GluonConfig(BN=64, BM=64, SPLIT_K=1, STAGES=4)),
        # two-part x tiles (64 + 16, 64 + 32, 128 + 32, 128 + 64 rows): a program's wgmma work follows BM, so a
        # tile that fits M closely beats the next power of two (docs/benchmarks.md, "Two-part x tiles")
        (80, GluonConfig(BN=64, BM=80, SPLIT_K=1, STAGES=4)),
        (96, GluonConfig(BN=64, BM=96, SPLIT_K=1, STAGES=3)),
        (128, GluonConfig(BN=64, BM=128, SPLIT_K=1, STAGES=3)),
        (160, GluonConfig(BN=64, BM=160, SPLIT_K=1, STAGES=3, X_STAGES=6)),
        (192, GluonConfig(BN=64, BM=192, SPLIT_K=1, STAGES=3, X_STAGES=6)),
        (256, _X256_W64),
        (320, GluonConfig(BN=128, BM=160, SPLIT_K=1, STAGES=3, num_warps=8, X_STAGES=6)),  # two 128 + 32 tiles
        (512, _X256_W128),
        (576, GluonConfig(BN=64, BM=192, SPLIT_K=1, STAGES=3, X_STAGES=6)),  # three 128 + 64 tiles
        # three 256-row x tiles: 384 programs of 64 weight rows take ~3 short waves, where 192 of 128 rows leave a
        # half-empty second long one (docs/benchmarks.md, "x rows padded to the tile")
        (768, _X256_W64),
    ),
    larger=_X256_W128,
)

# The Triton paths (the CPU interpreter cannot run Gluon; also every shape on a GPU): M = 1 the CUDA-core GEMV
# (exact 16-element block sums); up to M = 256 the in-kernel decode on tensor cores (tl: W decoded in registers,
# through shared memory into wgmma); larger M the pre-pass path (W decoded to a workspace, then the TMA GEMM).
INTERPRETER_CONFIGS = ConfigTable(
    rows=(
        (1, GemvConfig(BLOCK_N=64, BLOCK_M=1, BLOCK_K=512, SPLIT_K=4, num_warps=4, num_stages=1)),
        (16, TensorCoreConfig(BLOCK_N=64, BLOCK_M=16, BLOCK_K=128, SPLIT_K=4, num_warps=4, num_stages=4)),
        (64, TensorCoreConfig(BLOCK_N=64, BLOCK_M=64, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=4)),
        (256, TensorCoreConfig(BLOCK_N=64, BLOCK_M=128, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=3)),
    ),
    larger=PrepassConfig(gemm=TmaConfig(128, 256, 64, SPLIT_K=1, GROUP_M=8, num_warps=8, num_stages=3),
                         BLOCK_R=16, BLOCK_C=512, num_warps=4, mode="cvt"),
)

# The quantizer's tile by M (same table shape).
QUANTIZE_CONFIGS = ConfigTable(rows=(), larger=QuantizeConfig(BLOCK_R=4, BLOCK_C=1024, num_warps=4))


def pick_config(M: int, N: int, K: int, interpreter: bool | None = None):
    """The config that serves x [M, K] times W [N, K]: the CONFIGS row for M on a GPU (a GluonConfig or Dp4aConfig that
    does not fit N and K gives way to the INTERPRETER_CONFIGS row), the INTERPRETER_CONFIGS row in the CPU interpreter
    (``interpreter`` None: ``_runtime.interpreting()``)."""
    if isinstance(M, bool) or not isinstance(M, int) or M < 1:
        raise ValueError(f"M={M!r}: expected an int >= 1")
    if interpreter is None:
        interpreter = interpreting()
    cfg = INTERPRETER_CONFIGS.pick(M) if interpreter else CONFIGS.pick(M)
    if isinstance(cfg, (GluonConfig, Dp4aConfig)) and not cfg.fits(N, K):
        cfg = INTERPRETER_CONFIGS.pick(M)
    return cfg


def pick_quantize_config(M: int, K: int) -> QuantizeConfig:
    """The quantize tile for x [M, K]: the QUANTIZE_CONFIGS row for M, BLOCK_C capped at K's next power of two
    (BLOCK_R grows to keep the tile's element count) and BLOCK_R at M's. TypeError / ValueError unless M >= 1 and
    K a positive multiple of 16 (ints); ``grid_sync_config`` and ``read_all_config`` check the same, and
    ``grid_sync_config`` an int ``max_programs`` >= 1."""
    _check_sizes(M, K)
    t = QUANTIZE_CONFIGS.pick(M)
    block_c = min(triton.next_power_of_2(K), t.BLOCK_C)
    block_r = max(1, min(t.BLOCK_R * t.BLOCK_C // block_c, triton.next_power_of_2(M)))
    return QuantizeConfig(block_r, block_c, t.num_warps)


GRID_SYNC_MAX_WARPS = 16  # the largest grid-sync tile: 16 warps x 32 elements per thread
# The read-all form's largest x (next_power_of_2(M) x next_power_of_2(K) elements; M = 8 at K = 8192) and its
# tile: at most 1024 columns and 8192 elements, 8 warps (H200, CUPTI, nvfp4_linear at K = 8192: docs/benchmarks.md)
READ_ALL_MAX_ELEMENTS = 65536
READ_ALL_TILE_C = 1024
READ_ALL_TILE_ELEMENTS = 8192
READ_ALL_WARPS = 8


def grid_sync_config(M: int, K: int, max_programs: int) -> QuantizeConfig | None:
    """The one-launch grid-barrier (AMAX "grid_sync") quantize tile for x [M, K] with at most ``max_programs``
    programs (the SM count, so that a cooperative launch is always possible): ``pick_quantize_config``'s tile (4
    warps, 4096 elements), doubled with its warps (32 elements per thread) until the grid fits, up to
    GRID_SYNC_MAX_WARPS warps; None where even that grid is larger (then the two-launch form)."""
    _check_sizes(M, K)
    check_ints(max_programs=max_programs)
    if max_programs < 1:
        raise ValueError(f"max_programs={max_programs}: expected >= 1")
    t = QUANTIZE_CONFIGS.pick(M)
    warps = t.num_warps
    while warps <= GRID_SYNC_MAX_WARPS:
        elements = t.BLOCK_R * t.BLOCK_C * warps // t.num_warps
        block_c = min(triton.next_power_of_2(K), t.BLOCK_C)
        block_r = max(1, min(elements // block_c, triton.next_power_of_2(M)))
        if triton.cdiv(M, block_r) * triton.cdiv(K, block_c) <= max_programs:
            return QuantizeConfig(block_r, block_c, warps, AMAX="grid_sync")
        warps *= 2
    return None


# The cluster form: one cluster of 16 programs (sm_90's largest, a non-portable cluster size) of 8 warps, tiles of
# at most 2048 columns and 8192 elements (32 per thread): x padded to powers of two of at most 131072 elements
# (M <= 16 at K = 8192). H200, CUPTI, nvfp4_linear at K = 8192: docs/benchmarks.md
CLUSTER_CTAS = 16
CLUSTER_TILE_C = 2048
CLUSTER_WARPS = 8


def cluster_config(M: int, K: int) -> QuantizeConfig | None:
    """The one-launch cluster (AMAX "cluster") quantize tile for x [M, K]: x padded to powers of two split into
    CLUSTER_CTAS equal tiles of at most CLUSTER_TILE_C columns (the rest rows), CLUSTER_WARPS warps; None where a
    tile would have fewer elements than threads or more than 32 per thread. Programs whose tile lies wholly in the
    padding load and store nothing (they still take part in the exchange)."""
    _check_sizes(M, K)
    rows, cols = triton.next_power_of_2(M), triton.next_power_of_2(K)
    tile = rows * cols // CLUSTER_CTAS
    if not 32 * CLUSTER_WARPS <= tile <= 32 * 32 * CLUSTER_WARPS:
        return None
    block_c = min(cols, CLUSTER_TILE_C, tile)
    return QuantizeConfig(tile // block_c, block_c, CLUSTER_WARPS, AMAX="cluster")


def read_all_config(M: int, K: int) -> QuantizeConfig | None:
    """The one-launch read-all (AMAX "read_all") quantize tile for x [M, K]: READ_ALL_TILE_C columns (at most K's
    next power of two) x as many of M's rows (padded to a power of two) as READ_ALL_TILE_ELEMENTS allows,
    READ_ALL_WARPS warps; None where x padded to powers of two has more than READ_ALL_MAX_ELEMENTS elements (every
    program holds all of it in registers)."""
    _check_sizes(M, K)
    rows, cols = triton.next_power_of_2(M), triton.next_power_of_2(K)
    if rows * cols > READ_ALL_MAX_ELEMENTS:
        return None
    block_c = min(cols, READ_ALL_TILE_C)
    return QuantizeConfig(min(rows, READ_ALL_TILE_ELEMENTS // block_c), block_c, READ_ALL_WARPS, AMAX="read_all")


def block_k_for(K: int, block_k: int) -> int:
    """The largest power of two <= block_k that divides K (>= 16 since K % 16 == 0): no K masks in the loop."""
    b = block_k
    while K % b:
        b //= 2
    return b


_CONFIG_TYPES = (GemvConfig, TensorCoreConfig, PrepassConfig, GluonConfig, Dp4aConfig)


def accumulation_model(config, K: int, interpreter: bool | None = False, **launch) -> str:
    """The fp4ref.bounds model name of ``config`` at reduction length ``K`` (NUMERIC_CONTRACT).

    GemvConfig: ``splitk(fp32_rn_block16, C)``, C = the products one program accumulates (whole BLOCK_K steps, split
    evenly as the kernel does), GPU and interpreter alike. Dp4aConfig (GPU only): the same model with C = K / SPLIT_K
    (exact integer block sums, fp32 RN over the block terms; dp4a.py). GluonConfig (GPU only): ``hopper_fp16_wgmma``,
    ``splitk(hopper_fp16_wgmma, K / SPLIT_K)`` when split (the K permutation within a step changes only the order of the
    products, which the block-FMA model does not depend on). TensorCoreConfig and PrepassConfig: the contract's
    ``model`` (``hopper_fp16_wgmma``), or ``fp32_rn`` in the interpreter (None: ``interpreting()``). ``launch`` (M, N)
    does not change the model.

    Raises:
        TypeError: config is not one of the four config types.
        ValueError: K is not a positive multiple of 16.
    """
    if not isinstance(config, _CONFIG_TYPES):
        raise TypeError(f"config: expected a GemvConfig, TensorCoreConfig, PrepassConfig, GluonConfig or Dp4aConfig, "
                        f"got {type(config).__name__}")
    if isinstance(K, bool) or not isinstance(K, int) or K <= 0 or K % 16:
        raise ValueError(f"K={K!r}: expected a positive multiple of 16")
    if isinstance(config, GemvConfig):
        bk = block_k_for(K, config.BLOCK_K)
        steps = K // bk
        chunk = -(-steps // config.SPLIT_K) * bk
        return f"splitk(fp32_rn_block16, {chunk})"
    if isinstance(config, Dp4aConfig):
        return f"splitk(fp32_rn_block16, {K // config.SPLIT_K})"
    if isinstance(config, GluonConfig):
        return f"splitk(hopper_fp16_wgmma, {K // config.SPLIT_K})" if config.SPLIT_K > 1 else "hopper_fp16_wgmma"
    if interpreter is None:
        interpreter = interpreting()
    return NUMERIC_CONTRACT.model_interpreter if interpreter else NUMERIC_CONTRACT.model


NUMERIC_CONTRACT = NumericContract(
    inputs="x bfloat16 / float16 / float32 [M, K] (quantized per call to NVFP4, recipe 'sol'); W NVFP4 [N, K]",
    output="bfloat16",
    # Tensor-core paths on the GPU: exact fp16 products (E2M1 x E4M3 values), Hopper wgmma fp32 accumulation (k = 16
    # products per step, F = 25 alignment bits, RZ). Split-K configs accumulate chunks of K/SPLIT_K with the same
    # model and add the SPLIT_K fp32 partials in fixed order (RN); that error, eps(K/S) + gamma_{S-1}(2^-24), stays
    # below eps(K) of the unsplit model for every K >= 16. The GEMV's model (accumulation_model) is tighter still,
    # so this one model bounds every config.
    model="hopper_fp16_wgmma",
    # In the CPU interpreter tl.dot is a numpy fp32 matmul: recursive fp32 RN summation, any order.
    model_interpreter="fp32_rn",
    output_rounding="rne",
    output_rounding_interpreter="faithful",  # the interpreter truncates fp32 -> bf16 stores
    # epilogue: acc * fp32(x_global_decode * weight_global_decode): two fp32 RNE multiplies, then ONE rounding to
    # bf16 (fp4ref.gemm's Reference.epilogue_multiplies = 2)
    epilogue_multiplies=2,
    config_model=accumulation_model,
    pick_config=pick_config,
    notes={
        "quantize_recipe": RECIPE,
        "quantizer": "fp4ref.blockscale.nvfp4_quantize(x, recipe='sol') bit for bit (codes, scale bytes, global "
                     "decode scale) for every finite x; NaN/inf in x are outside the contract (the recipe has no NaN "
                     "policy and the op does not synchronise to check)",
        "gemv": "GemvConfig: each 16-element block's dot product is EXACT in fp32 and only the K/16 block terms are "
                "added in fp32 (RN), per K split, then the fixed-order split-K sum: splitk(fp32_rn_block16, C) with "
                "C the split's length in products (GPU and interpreter alike)",
        "dp4a": "Dp4aConfig: the doubled E2M1 codes of W and x multiplied and summed per 16-element block in "
                "int32 (dp4a, exact), times the two block scales in fp32 (exact), the K/16 block terms added in "
                "fp32 (RN): splitk(fp32_rn_block16, K / SPLIT_K)",
        "split_k": "partials summed in the fixed order s = 0, 1, ... by the tile's last program: bitwise "
                   "deterministic",
        "weight_global_decode_scale": "rounded to fp32 (RNE) once; the workload passes fp32 values (exact)",
    },
)
