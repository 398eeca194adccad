"""2:4 structured-sparse E2M1 x E4M3FN GEMM, bf16 out (FlashInfer-Bench workload sparse_gemm_fp4_fp8_n2048_k2048).

    c[m, n] = sum_g ( v0[m, g] * b[n, 4g + idx0[m, g]]  +  v1[m, g] * b[n, 4g + idx1[m, g]] )

Operands (docs/kernels.md, "sparse_gemm_fp4_fp8"), K = 4 * G:
    a_vals  int8 [M, G]  byte (read as unsigned): low nibble = E2M1 code of v0, high nibble = E2M1 code of v1
    a_meta  int8 [M, G]  byte (read as unsigned): bits 1:0 = idx0, bits 3:2 = idx1, bits 7:4 ignored
    b_fp8   torch.float8_e4m3fn [N, K]
    c       torch.bfloat16 [M, N]
Every byte pair is defined: idx0 == idx1 ADDS the two values, idx0 > idx1 is as good as idx0 < idx1.

Policies (each a tested choice):
- NaN: an E4M3FN NaN byte (0x7F / 0xFF) of b makes c[m, n] NaN iff the sum above READS it, i.e. it sits at a
  position 4g + idx0 or 4g + idx1 that row m's metadata selects (IEEE: NaN * 0 = NaN, so a selected NaN times a
  zero value still gives NaN). A NaN at a pruned position does not reach c.
- Signed zero: a zero result may come out as +0 where the exact sum is -0 (tensor cores and fp32 adds give +0).
- Output: one RNE rounding from the fp32 accumulator to bf16 (no intermediate rounding).

Paths (configs.py; the config's type picks the path): ``GemvConfig`` (gemv.py: CUDA cores, b read as int32 words
by many small programs, every row of A per program, no split-K, one launch; a `tl` kernel the interpreter runs
too) serves M <= 2 on a GPU; ``GluonConfig`` (gluon.py, sm_90: swap-AB fp8 wgmma, b by TMA, the K slice's A
decoded while b streams in, promotion overlapping the next wgmma, one launch) serves M = 3 .. 32 on a GPU;
``FusedConfig`` (fused.py: A decoded in the GEMM's K loop, one launch, split-K) serves the CPU interpreter and the
calls the Gluon path cannot take; ``ExpandConfig`` (expand.py: decode pre-pass to a dense E4M3FN A, then a
persistent TMA fp8 GEMM: on a GPU by default expand_gluon.py's warp-specialized Gluon kernel, launched with
programmatic dependent launch, else the `tl` one with its NaN fix-up) serves larger M;
``FusedWSConfig`` (fused_gluon.py, sm_90, opt-in: one persistent launch, A decoded per tile into shared memory by a
decoder partition, no dense-A workspace; slower than the table's paths on the H200). Host plumbing (plans,
launches, workspaces) is kernels/_runtime.py.
"""
from __future__ import annotations

import torch
import triton

from .. import _runtime
from .configs import (CONFIGS, FALLBACK_CONFIG, INTERPRETER_CONFIG, MMA_KINDS, NUMERIC_CONTRACT, PROMOTION_INTERVAL,
                      TL_CONFIGS, ExpandConfig, FusedConfig, FusedWSConfig, GemvConfig, GluonConfig,
                      accumulation_model, pick_config)
from .expand import (PREP_BLOCK_G, PREP_BLOCK_M, PREP_WARPS, sparse_expand_a_kernel, sparse_gemm_expanded_kernel,
                     sparse_nan_fixup_kernel)
from .expand_gluon import expand_gluon_constexprs, expand_gluon_layouts, sparse_expanded_ws_kernel
from .fused import sparse_gemm_fp4_fp8_kernel
from .fused_gluon import fused_ws_constexprs, fused_ws_layouts, sparse_fused_ws_kernel
from .gemv import sparse_gemv_kernel
from .gluon import STEP_K, decode_table, gluon_constexprs, shared_layouts, sparse_swapab_kernel

__all__ = ["CONFIGS", "ExpandConfig", "FALLBACK_CONFIG", "FusedConfig", "FusedWSConfig", "GemvConfig", "GluonConfig",
           "INTERPRETER_CONFIG", "NUMERIC_CONTRACT", "PLANS", "PROMOTION_INTERVAL", "TL_CONFIGS", "WS_COUNTERS",
           "WS_DENSE_A", "WS_NAN_FLAGS", "WS_PARTIALS", "accumulation_model", "gemv_eligible", "gluon_eligible",
           "pick_config", "sparse_gemm_fp4_fp8", "tma_eligible"]

# Workspaces (_runtime.workspace, per device and stream): split-K fp32 partials and int32 arrival counters (zero
# between launches), the expand path's dense E4M3FN A, its int32 NaN-tile flags (zero between launches).
WS_PARTIALS = "sparse_gemm_fp4_fp8.splitk_partials"
WS_COUNTERS = "sparse_gemm_fp4_fp8.splitk_counters"
WS_DENSE_A = "sparse_gemm_fp4_fp8.dense_a"
WS_NAN_FLAGS = "sparse_gemm_fp4_fp8.nan_flags"

# The expand path with the Gluon GEMM launches the GEMM with programmatic dependent launch after the pre-pass
# (expand_gluon.py); False launches them one after the other (an A/B switch for benchmarks; plans built after a
# change use it).
EXPAND_PDL = True

# Launch plans by key: dtypes, shapes, strides, devices, 16-byte alignment of every pointer, out's strides and
# alignment, config, nan_check_bytes. The key fixes everything Triton specialises the kept kernels on (N, K and
# the strides are in it; M and num_programs are do_not_specialize; workspaces are torch allocations).
PLANS = _runtime.PlanCache("sparse_gemm_fp4_fp8")


def sparse_gemm_fp4_fp8(a_vals: torch.Tensor, a_meta: torch.Tensor, b_fp8: torch.Tensor,
                        config: GemvConfig | GluonConfig | FusedWSConfig | FusedConfig | ExpandConfig | None = None, *,
                        out: torch.Tensor | None = None, nan_check_bytes: bool | None = None) -> torch.Tensor:
    """2:4 sparse E2M1 A times dense E4M3FN B^T -> bf16, c = A @ B.T (module docstring).

    Args:
        a_vals: int8 [M, K/4]; per group of 4 K-columns, E2M1 codes v0 (bits 3:0) and v1 (bits 7:4), bytes read
            as unsigned.
        a_meta: int8 [M, K/4], same strides as a_vals; idx0 = bits 1:0, idx1 = bits 3:2 (positions 0..3 in the
            group); bits 7:4 ignored. Any byte is accepted (non-canonical too: equal indices add, order is free).
        b_fp8: torch.float8_e4m3fn [N, K], any strides. M, N >= 1; K >= 4 and K % 4 == 0; no other alignment
            (an ExpandConfig also needs ``tma_eligible(b_fp8)``; the default pick falls back to FALLBACK_CONFIG
            where it does not hold).
        config: a GemvConfig, GluonConfig, FusedWSConfig, FusedConfig or ExpandConfig overriding
            ``pick_config(M, N, K)`` (benchmarks, tests, or the one-launch FusedWSConfig). A GemvConfig needs
            ``gemv_eligible(b_fp8)`` and M <= its ``max_m``. A GluonConfig or FusedWSConfig needs a CUDA device,
            K % 128 == 0 and ``gluon_eligible`` operands; the default pick takes the ``TL_CONFIGS`` row where
            these do not hold.
        out: optional bf16 [M, N] tensor to write (e.g. NaN-poisoned by a test), any strides that keep its
            elements distinct; returned.
        nan_check_bytes: detect NaN bytes of b by their bits (True) or from the raw accumulator (False).
            Default: False on a GPU (free), True under the CPU interpreter, which decodes E4M3FN NaN bytes as
            +-480 (so False is refused there). The Gluon path (GPU only) always checks its fp32 accumulator,
            which is exact there.

    Returns:
        torch.bfloat16 [M, N]: one RNE rounding of the fp32 accumulator (NUMERIC_CONTRACT). A NaN byte of b at a
        position the metadata selects gives NaN; one at a pruned position does not.

    Raises:
        TypeError: an operand is not a tensor of the dtype above; ``out`` is not a bf16 tensor; ``config`` is not
            a GemvConfig / GluonConfig / FusedWSConfig / FusedConfig / ExpandConfig; ``nan_check_bytes`` not None
            or a bool.
        ValueError: not 2-D; M, N < 1; K < 4 or K % 4 != 0; a_vals / a_meta not [M, K/4] or of different
            strides; ``out`` not [M, N], overlapping an operand or with elements sharing memory;
            ``nan_check_bytes=False`` in the CPU interpreter; operands on different devices; an fp8 config
            with block_k > 128; an explicit ExpandConfig with a b_fp8 its TMA descriptors cannot read; an explicit
            GluonConfig in the CPU interpreter, with K % 128 != 0, with operands ``gluon_eligible`` rejects or an
            ``out`` without unit column stride (the default pick takes the ``TL_CONFIGS`` row there); an
            explicit ExpandConfig(gemm="gluon") or FusedWSConfig in the CPU interpreter, with K % 128 != 0, with
            operands ``gluon_eligible`` rejects or an ``out`` its TMA descriptor cannot take (unit column stride,
            16-byte row stride and base); an explicit GemvConfig with M > its ``max_m`` or a b_fp8
            ``gemv_eligible`` rejects.

    Host cost: the first call per plan key validates and compiles through Triton's JIT; later calls look the
    plan up, check ``out``, fetch the workspaces (per device and stream) and launch the kept kernels
    (_runtime.Launch).

    Source: workload sparse_gemm_fp4_fp8_n2048_k2048 (FlashInfer-Bench); layout and semantics in docs/kernels.md;
    reference fp4ref.gemm.sparse_gemm_fp4_fp8.
    """
    for name, t in (("a_vals", a_vals), ("a_meta", a_meta), ("b_fp8", b_fp8)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if out is not None and (not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16):
        raise TypeError(f"out: expected a torch.bfloat16 tensor, got {getattr(out, 'dtype', type(out).__name__)}")
    if nan_check_bytes is not None and not isinstance(nan_check_bytes, bool):
        kind = type(nan_check_bytes)
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        raise TypeError(f"nan_check_bytes: expected None or a Python bool, got {name} (pass bool(...))")
    if config is not None and not isinstance(config, (GemvConfig, GluonConfig, FusedWSConfig, FusedConfig,
                                                      ExpandConfig)):
        raise TypeError(f"config: expected a GemvConfig, a GluonConfig, a FusedWSConfig, a FusedConfig, an "
                        f"ExpandConfig or None, got {type(config).__name__}")

    # ---- the launch plan of this key (validated and built on its first call) ----
    sa, sb = a_vals.stride(), b_fp8.stride()
    key = (a_vals.dtype, a_meta.dtype, b_fp8.dtype, a_vals.shape, a_meta.shape, b_fp8.shape,
           sa, a_meta.stride(), sb, a_vals.device, a_meta.device, b_fp8.device,
           # the bases' residues, not only 16-byte alignment: the GEMV path reads b as int32 words (4 bytes)
           a_vals.data_ptr() % 16, a_meta.data_ptr() % 16, b_fp8.data_ptr() % 16,
           None if out is None else (out.stride(), out.data_ptr() % 16), config, nan_check_bytes)
    plan = PLANS.get(key)
    new = plan is None
    if new:
        plan = _make_plan(a_vals, a_meta, b_fp8, config, nan_check_bytes, out)

    # ---- output ----
    m = a_vals.shape[0]
    n = b_fp8.shape[0]
    device = b_fp8.device
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=device)
    elif tuple(out.shape) != (m, n) or out.device != device:
        raise ValueError(f"out.shape={tuple(out.shape)} on {out.device}: expected ({m}, {n}) on {device}")
    else:
        _runtime.check_no_overlap(out, "out", a_vals=a_vals, a_meta=a_meta, b_fp8=b_fp8)
    if new:
        PLANS.put(key, plan)  # only once the whole call validated

    # ---- launch ----
    plan.run(_runtime.current_stream(device), a_vals, a_meta, b_fp8, out, sa, sb)
    return out


def tma_eligible(b_fp8: torch.Tensor) -> bool:
    """Whether b_fp8 [N, K] can feed the expand path's TMA descriptors: unit stride along K, 16-byte row stride
    and base, K % 16 == 0 (the dense-A workspace rows). Where it fails, the default pick uses FALLBACK_CONFIG."""
    n, k = b_fp8.shape
    return (k % 16 == 0 and b_fp8.stride(1) == 1 and (n == 1 or b_fp8.stride(0) % 16 == 0)
            and b_fp8.data_ptr() % 16 == 0)


def gemv_eligible(b_fp8: torch.Tensor) -> bool:
    """Whether the GEMV path can read b_fp8 [N, K] as int32 words (one per group of 4 K-columns): unit stride
    along K, row stride and base multiples of 4 bytes. Where it fails, the default pick uses the ``TL_CONFIGS`` row."""
    n = b_fp8.shape[0]
    return b_fp8.stride(1) == 1 and (n == 1 or b_fp8.stride(0) % 4 == 0) and b_fp8.data_ptr() % 4 == 0


def gluon_eligible(a_vals: torch.Tensor, a_meta: torch.Tensor, b_fp8: torch.Tensor) -> bool:
    """Whether the operands can feed the Gluon path's TMA descriptors: b_fp8 as ``tma_eligible`` requires, and
    a_vals / a_meta with unit stride along groups, 16-byte row strides and 16-byte aligned bases."""
    m = a_vals.shape[0]
    return tma_eligible(b_fp8) and all(
        t.stride(1) == 1 and (m == 1 or t.stride(0) % 16 == 0) and t.data_ptr() % 16 == 0 for t in (a_vals, a_meta))


# ---------------------------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------------------------
class _GluonPlan:
    """One launch of gluon.sparse_swapab_kernel: the Launch (with its TMA descriptors' geometry), the split-K
    workspace size (0 without split-K) and the number of c tiles (arrival counters)."""

    __slots__ = ("config", "main", "ws_elems", "n_tiles")

    def __init__(self, config, main, ws_elems, n_tiles):
        self.config, self.main, self.ws_elems, self.n_tiles = config, main, ws_elems, n_tiles

    def run(self, stream, a_vals, a_meta, b_fp8, out, sa, sb) -> None:
        device = out.device
        ws, cnt = _runtime.split_scratch(device, stream, WS_PARTIALS, self.ws_elems, WS_COUNTERS, self.n_tiles)
        m = a_vals.shape[0]
        n, k = b_fp8.shape
        self.main.launch(stream, b_fp8, a_vals, a_meta, b_fp8, a_vals, a_meta, out, ws, cnt, decode_table(device), m,
                         n, k // STEP_K, sb[0], sa[0], out.stride(0))


class _FusedWSPlan:
    """One launch of fused_gluon.sparse_fused_ws_kernel (persistent; the Launch holds its TMA descriptors'
    geometry)."""

    __slots__ = ("config", "main")

    def __init__(self, config, main):
        self.config, self.main = config, main

    def run(self, stream, a_vals, a_meta, b_fp8, out, sa, sb) -> None:
        m = a_vals.shape[0]
        n, k = b_fp8.shape
        self.main.launch(stream, a_vals, a_meta, b_fp8, out, b_fp8, a_vals, a_meta, out, m, n, k // STEP_K, sb[0],
                         sa[0], out.stride(0))


class _GemvPlan:
    """One launch of gemv.sparse_gemv_kernel (no workspace)."""

    __slots__ = ("config", "main")

    def __init__(self, config, main):
        self.config, self.main = config, main

    def run(self, stream, a_vals, a_meta, b_fp8, out, sa, sb) -> None:
        m, g = a_vals.shape
        n = b_fp8.shape[0]
        scm, scn = out.stride()
        self.main.launch(stream, a_vals, a_meta, b_fp8, out, m, n, g, sa[0], sa[1], sb[0] if n > 1 else 4 * g,
                         scm, scn)


class _FusedPlan:
    """One launch of sparse_gemm_fp4_fp8_kernel; ``ws_elems`` fp32 split-K partials and ``n_tiles`` counters
    (0 partials without split-K: ``_runtime.unused_scratch`` in their places)."""

    __slots__ = ("config", "main", "ws_elems", "n_tiles")

    def __init__(self, config, main, ws_elems, n_tiles):
        self.config, self.main, self.ws_elems, self.n_tiles = config, main, ws_elems, n_tiles

    def run(self, stream, a_vals, a_meta, b_fp8, out, sa, sb) -> None:
        ws, locks = _runtime.split_scratch(out.device, stream, WS_PARTIALS, self.ws_elems, WS_COUNTERS,
                                           self.n_tiles)
        m, g = a_vals.shape
        n = b_fp8.shape[0]
        sam, sag = sa
        sbn, sbk = sb
        scm, scn = out.stride()
        self.main.launch(stream, a_vals, a_meta, b_fp8, out, ws, locks, m, n, 4 * g, sam, sag, sbn, sbk, scm, scn)


class _ExpandPlan:
    """The expand path's launches: the decode pre-pass, the persistent TMA GEMM (``config.gemm``: the `tl` or the
    Gluon kernel; its Launch holds the TMA descriptors' geometry: dense A, b and, for the Gluon GEMM, c) and
    (nan_fixup "launch") the NaN fix-up; ``a8_elems`` bytes of dense A, ``n_tiles`` flags. ``_a8`` keeps the last
    dense-A workspace with its int32 view (rebuilt when the workspace is another tensor: another stream, or
    grown)."""

    __slots__ = ("config", "prep", "main", "fix", "a8_elems", "n_tiles", "_a8")

    def __init__(self, config, prep, main, fix, a8_elems, n_tiles):
        self.config, self.prep, self.main, self.fix = config, prep, main, fix
        self.a8_elems, self.n_tiles = a8_elems, n_tiles
        self._a8 = (None, None)

    def run(self, stream, a_vals, a_meta, b_fp8, out, sa, sb) -> None:
        device = out.device
        m, g = a_vals.shape
        n, k = b_fp8.shape
        sam, sag = sa
        sbn, sbk = sb
        scm, scn = out.stride()
        a8 = _runtime.workspace(device, stream, WS_DENSE_A, self.a8_elems, torch.float8_e4m3fn)
        cached, a8w = self._a8
        if a8 is not cached:
            a8w = a8.view(torch.int32)
            self._a8 = (a8, a8w)
        self.prep.launch(stream, a_vals, a_meta, a8w, m, g, sam, sag, g)
        if self.config.gemm == "gluon":
            self.main.launch(stream, a8, b_fp8, out, b_fp8, a_vals, a_meta, out, m, n, k // self.config.block_k, sbn,
                             sam, scm)
            return
        fix = self.fix
        flags = _runtime.unused_scratch(device)[1]  # int32, unused with the inline fix-up
        if fix is not None:
            flags = _runtime.workspace(device, stream, WS_NAN_FLAGS, self.n_tiles, torch.int32, zeroed=True)
        self.main.launch(stream, a8, b_fp8, a_vals, a_meta, b_fp8, out, flags, m, n, k, self.main.grid[0],
                         sam, sag, sbn, sbk, scm, scn)
        if fix is not None:
            fix.launch(stream, a_vals, a_meta, b_fp8, out, flags, m, n, k, sam, sag, sbn, sbk, scm, scn)


def _unit_column_stride(out) -> bool:
    """Whether the Gluon swap-AB kernel can store into ``out`` (kernels/_gluon.py ``store_or_reduce`` indexes
    c[m, n] as m * stride_cm + n): unit column stride, or one column (None: the new contiguous output)."""
    return out is None or out.shape[1] == 1 or out.stride(1) == 1


def _c_tma_eligible(out, n: int) -> bool:
    """Whether c can take the Gluon GEMM's TMA stores: unit column stride, 16-byte row stride and base (``out``
    None: the new contiguous [M, N] output, so N % 8 == 0)."""
    if out is None:
        return n % 8 == 0
    return (out.dim() == 2 and out.stride(1) == 1 and (out.shape[0] == 1 or out.stride(0) % 8 == 0)
            and out.data_ptr() % 16 == 0)


def _check(name: str, t, dtype: torch.dtype) -> None:
    if t.dtype != dtype:
        # (fp4ref.compress_2to4 returns uint8 bytes: the same bytes as int8, the workload's operand dtype)
        hint = "; for uint8 bytes (fp4ref.compress_2to4) pass .view(torch.int8)" if (
            dtype == torch.int8 and t.dtype == torch.uint8) else ""
        raise TypeError(f"{name}.dtype={t.dtype}: expected {dtype}{hint}")
    if t.dim() != 2:
        raise ValueError(f"{name}.shape={tuple(t.shape)}: expected a 2-D tensor")


def _make_plan(a_vals, a_meta, b_fp8, config, nan_check_bytes, out):
    """Validate a new key's operands, pick path and config, and build its launch plan (raises as
    sparse_gemm_fp4_fp8 documents). ``out``: the caller's output tensor or None (a new contiguous one)."""
    _check("a_vals", a_vals, torch.int8)
    _check("a_meta", a_meta, torch.int8)
    _check("b_fp8", b_fp8, torch.float8_e4m3fn)
    n, k = b_fp8.shape
    m, g = a_vals.shape
    if k < 4 or k % 4 != 0:
        raise ValueError(f"b_fp8.shape={tuple(b_fp8.shape)}: K (dim 1) must be a positive multiple of 4, got K={k}")
    if n < 1:
        raise ValueError(f"b_fp8.shape={tuple(b_fp8.shape)}: N (dim 0) must be >= 1")
    if m < 1:
        raise ValueError(f"a_vals.shape={tuple(a_vals.shape)}: M (dim 0) must be >= 1")
    if g != k // 4:
        raise ValueError(f"a_vals.shape={tuple(a_vals.shape)}: expected [M, K/4] = [{m}, {k // 4}] for K={k} "
                         f"(b_fp8.shape={tuple(b_fp8.shape)})")
    if tuple(a_meta.shape) != tuple(a_vals.shape):
        raise ValueError(f"a_meta.shape={tuple(a_meta.shape)}: expected {tuple(a_vals.shape)} (as a_vals)")
    if not (a_vals.device == a_meta.device == b_fp8.device):
        raise ValueError(f"operands on different devices: a_vals {a_vals.device}, a_meta {a_meta.device}, "
                         f"b_fp8 {b_fp8.device}")
    _runtime.check_device(b_fp8, "b_fp8")
    if a_vals.stride() != a_meta.stride():
        raise ValueError(f"a_meta.stride()={a_meta.stride()}: expected a_vals' strides {a_vals.stride()} "
                         "(the kernels index both with one set)")
    # row strides of the TMA descriptors: a one-row tensor never uses its stride, so its row length stands in
    # (out None: the new contiguous [m, n] output; an out of another shape is refused after the plan is made)
    sam = a_vals.stride(0) if m > 1 else g
    sbn = b_fp8.stride(0) if n > 1 else k
    scm = out.stride(0) if out is not None and out.dim() == 2 and m > 1 else n
    interp = _runtime.interpreting()
    explicit = config is not None
    gluon_ok = gluon_eligible(a_vals, a_meta, b_fp8)
    if nan_check_bytes is False and _runtime.interpreting():
        raise ValueError("nan_check_bytes=False: the CPU interpreter decodes E4M3FN NaN bytes as +-480, so NaN "
                         "detection from the accumulator would miss them there; pass None or True")
    if out is not None:
        _runtime.check_distinct_elements(out, "out")
    c_tma_ok = _c_tma_eligible(out, n)
    ncb = bool(interp if nan_check_bytes is None else nan_check_bytes)  # NaN bytes found by their bits
    if config is None:
        config = pick_config(m, n, k, interp)
        if isinstance(config, GluonConfig) and not (gluon_ok and _unit_column_stride(out)):
            config = TL_CONFIGS.pick(m)
        if isinstance(config, ExpandConfig) and config.gemm == "gluon" and not (gluon_ok and c_tma_ok):
            config = TL_CONFIGS.pick(m)
        if isinstance(config, FusedWSConfig) and not (gluon_ok and c_tma_ok):
            config = TL_CONFIGS.pick(m)
        if isinstance(config, GemvConfig) and not (gemv_eligible(b_fp8) and m <= config.max_m):
            config = TL_CONFIGS.pick(m)
    if isinstance(config, GemvConfig):
        if m > config.max_m or not gemv_eligible(b_fp8):
            raise ValueError(f"config={config}: the GEMV path takes M <= {config.max_m} (max_m) and a b_fp8 it can "
                             f"read as int32 words (gemv_eligible: unit stride along K, row stride and base "
                             f"multiples of 4 bytes); got M={m}, b_fp8 strides {b_fp8.stride()}")
        block_m = 1 << (m - 1).bit_length()
        main = _runtime.Launch(sparse_gemv_kernel, (triton.cdiv(n, config.block_n),),
                               dict(BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_G=config.block_g, NAN_BITS=ncb),
                               num_warps=config.num_warps)
        return _GemvPlan(config, main)
    if isinstance(config, GluonConfig):
        if interp or b_fp8.device.type != "cuda":
            raise ValueError(f"config={config}: the Gluon path runs on CUDA (sm_90), not in the CPU interpreter")
        if not config.fits(k) or not gluon_eligible(a_vals, a_meta, b_fp8) or not _unit_column_stride(out):
            raise ValueError(f"config={config}: the Gluon path needs K % {STEP_K} == 0, a K slice whose decoded A "
                             f"fits in shared memory (GluonConfig.fits), operands its TMA descriptors can read "
                             f"(gluon_eligible) and an output with unit column stride; got K={k}, a_vals strides "
                             f"{a_vals.stride()}, b_fp8 strides {b_fp8.stride()}, out strides "
                             f"{None if out is None else out.stride()}")
        per, splits = config.k_split(k)
        tiles = triton.cdiv(n, config.BLOCK_N) * triton.cdiv(m, config.BLOCK_M)
        cluster = config.cluster_size(k)  # > 1: each program is a cluster of the tile's K slices
        fp8, raw = shared_layouts(cluster)
        a_desc = _runtime.Desc((m, g), (sam, 1), (config.BLOCK_M, STEP_K // 4), raw)  # a_vals, a_meta
        descs = (_runtime.Desc((n, k), (sbn, 1), (config.BLOCK_N, STEP_K), fp8), a_desc, a_desc)
        main = _runtime.Launch(sparse_swapab_kernel, (triton.cdiv(n, config.BLOCK_N), splits // cluster,
                                                      triton.cdiv(m, config.BLOCK_M)),
                               gluon_constexprs(config, k), descs=descs, num_ctas=cluster)
        ws_elems = tiles * splits * config.BLOCK_M * config.BLOCK_N if splits > 1 and cluster == 1 else 0
        return _GluonPlan(config, main, ws_elems, tiles)
    if isinstance(config, FusedWSConfig):
        if interp or b_fp8.device.type != "cuda":
            raise ValueError(f"config={config}: the fused Gluon kernel runs on CUDA (sm_90), not in the CPU "
                             "interpreter")
        if k % STEP_K != 0 or not (gluon_ok and c_tma_ok):
            raise ValueError(f"config={config}: the fused Gluon kernel needs K % {STEP_K} == 0, operands its TMA "
                             f"descriptors can read (gluon_eligible) and an output with unit column stride, "
                             f"16-byte row stride and base; got K={k}, a_vals strides {a_vals.stride()}, b_fp8 "
                             f"strides {b_fp8.stride()}")
        tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
        fp8, raw, c_layout = fused_ws_layouts(config)
        a_desc = _runtime.Desc((m, g), (sam, 1), (config.block_m, STEP_K // 4), raw)  # a_vals, a_meta
        descs = (a_desc, a_desc, _runtime.Desc((n, k), (sbn, 1), (config.block_n, STEP_K), fp8),
                 _runtime.Desc((m, n), (scm, 1), (config.block_m, config.block_n), c_layout))
        main = _runtime.Launch(sparse_fused_ws_kernel, (min(tiles, _runtime.num_sms(b_fp8.device)),),
                               fused_ws_constexprs(config), descs=descs)
        return _FusedWSPlan(config, main)
    expand = isinstance(config, ExpandConfig)
    # the `tl` kernels from here on (fused, the expand pre-pass and GEMM, the NaN fix-up) index with 32-bit offsets
    _runtime.check_int32_offsets(f"{type(config).__name__} path", a_vals=_runtime.element_extent(a_vals),
                                 b_fp8=_runtime.element_extent(b_fp8),
                                 out=m * n if out is None else _runtime.element_extent(out),
                                 dense_A_words=m * g if expand else 0)
    if (expand or config.mma == "fp8") and config.block_k > PROMOTION_INTERVAL:
        raise ValueError(f"config.block_k={config.block_k}: fp8 MMA needs block_k <= {PROMOTION_INTERVAL} "
                         "(the promotion interval of the numeric contract)")
    if expand and config.gemm == "gluon":
        if interp or b_fp8.device.type != "cuda":
            raise ValueError(f"config={config}: the Gluon GEMM runs on CUDA (sm_90), not in the CPU interpreter")
        if k % config.block_k != 0 or not (gluon_ok and c_tma_ok):
            raise ValueError(f"config={config}: the Gluon GEMM needs K % {config.block_k} == 0, operands its TMA "
                             f"descriptors can read (gluon_eligible) and an output with unit column stride, "
                             f"16-byte row stride and base; got K={k}, a_vals strides {a_vals.stride()}, b_fp8 "
                             f"strides {b_fp8.stride()}, N={n}")
    if expand and not tma_eligible(b_fp8):
        if explicit:
            raise ValueError(f"config: an ExpandConfig (the expand path's TMA descriptors) needs b_fp8 with unit "
                             f"stride along K, 16-byte row stride and base and K % 16 == 0; got shape "
                             f"{tuple(b_fp8.shape)}, strides {b_fp8.stride()}")
        config, expand = FALLBACK_CONFIG, False
    even_k = k % config.block_k == 0
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    if expand:
        nprog = min(tiles, _runtime.num_sms(b_fp8.device) * config.programs_per_sm)
        pdl = config.gemm == "gluon" and EXPAND_PDL
        prep = _runtime.Launch(sparse_expand_a_kernel, (triton.cdiv(m, PREP_BLOCK_M), triton.cdiv(g, PREP_BLOCK_G)),
                               dict(BLOCK_M=PREP_BLOCK_M, BLOCK_G=PREP_BLOCK_G, TRIGGER_DEPENDENTS=pdl),
                               num_warps=PREP_WARPS, num_stages=1)
        a8_elems = -(-(m * k) // 16) * 16  # int32-viewable
        # TMA descriptors of the GEMM: the dense-A workspace [m, k], b, and (Gluon GEMM) c
        fp8, c_layout = expand_gluon_layouts(config) if config.gemm == "gluon" else (None, None)
        ab = (_runtime.Desc((m, k), (k, 1), (config.block_m, config.block_k), fp8),
              _runtime.Desc((n, k), (sbn, 1), (config.block_n // config.n_split, config.block_k), fp8))
        if config.gemm == "gluon":
            descs = (*ab, _runtime.Desc((m, n), (scm, 1), (config.block_m, config.block_n), c_layout))
            main = _runtime.Launch(sparse_expanded_ws_kernel, (nprog,), expand_gluon_constexprs(config, pdl),
                                   descs=descs, launch_pdl=pdl)
            return _ExpandPlan(config, prep, main, None, a8_elems, tiles)
        main = _runtime.Launch(sparse_gemm_expanded_kernel, (nprog,),
                               dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                                    GROUP_M=config.group_m, N_SPLIT=config.n_split,
                                    INLINE_FIXUP=config.nan_fixup == "inline", NAN_CHECK_BYTES=ncb, EVEN_K=even_k),
                               descs=ab, num_warps=config.num_warps, num_stages=config.num_stages)
        fix = None
        if config.nan_fixup == "launch":
            fix = _runtime.Launch(sparse_nan_fixup_kernel, (tiles,),
                                  dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                                       BN=config.block_n // config.n_split, EVEN_K=even_k),
                                  num_warps=config.num_warps, num_stages=2)
        return _ExpandPlan(config, prep, main, fix, a8_elems, tiles)
    split_k = max(1, min(config.split_k, triton.cdiv(k, config.block_k)))
    main = _runtime.Launch(sparse_gemm_fp4_fp8_kernel, (tiles, split_k),
                           dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                                SPLIT_K=split_k, GROUP_M=config.group_m, MMA=MMA_KINDS[config.mma],
                                NAN_CHECK_BYTES=ncb, EVEN_K=even_k),
                           num_warps=config.num_warps, num_stages=config.num_stages)
    ws_elems = tiles * split_k * config.block_m * config.block_n if split_k > 1 else 0
    # (its split-K partials are indexed tile * (SPLIT_K * BLOCK_M * BLOCK_N) + ..., 32-bit too)
    _runtime.check_int32_offsets("FusedConfig path", split_k_partials=ws_elems)
    return _FusedPlan(config, main, ws_elems, tiles)
