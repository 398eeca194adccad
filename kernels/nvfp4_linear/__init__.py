"""NVFP4 quantize and the NVFP4 linear layer (in = out = 8192 workload) for Hopper (sm_90), in Triton.

Workload: SOL-ExecBench ``nvfp4_linear_layer``: y = x @ W^T with x (bf16) quantized per call to NVFP4 by the recipe
fp4ref names "sol", W given as NVFP4 (E2M1 codes, E4M3FN block scales, fp32 global decode scale), bf16 out.
docs/kernels.md, section nvfp4_linear, describes the paths and their numerics.

A call: quantize x (quantize.py: amax, then codes * block scales, exact; one launch up to M = 256 at K = 8192 on a
GPU, two above), then one path, chosen by M from
``CONFIGS`` (configs.py; the config's type names the path):

* ``Dp4aConfig`` (dp4a.py, GPU): integer dot products of the doubled E2M1 codes on the CUDA cores (Gluon), M = 1;
* ``GluonConfig`` (gluon.py, GPU): W decoded in registers straight into the wgmma A operand (Gluon), every other M;
* ``GemvConfig`` (gemv.py): the CUDA-core GEMV, batch-1 decode (the CPU interpreter's M = 1 path);
* ``TensorCoreConfig`` (tensorcore.py): W decoded in registers, tensor cores, split-K;
* ``PrepassConfig`` (prepass.py): W decoded to an fp16 workspace, then gemm_fp16's TMA GEMM (large M in the CPU
  interpreter, and shapes the Gluon path cannot take).

Epilogue on every path: acc * fp32(x_global_decode * weight_global_decode), one RNE rounding to bf16.
Bitwise deterministic (no floating-point atomics, fixed reduction orders); no host synchronisation. Host
plumbing (launch plans, workspaces, direct launches) is kernels/_runtime.py's: after the first call of a shape,
a call is a plan lookup, a few checks and the plan's launches. Workspaces are per (device, stream): calls on one
stream are ordered; concurrent calls from several host threads on one stream are not supported. Nothing runs at
import.
"""
from __future__ import annotations

import functools
import numbers

import numpy as np
import torch

from .._runtime import PlanCache, check_device, check_no_overlap, current_stream, interpreting, num_sms, workspace
from .configs import (CONFIGS, INTERPRETER_CONFIGS, NUMERIC_CONTRACT, QUANTIZE_CONFIGS, RECIPE, Dp4aConfig,
                      GemvConfig, GluonConfig, PrepassConfig, QuantizeConfig, TensorCoreConfig, accumulation_model,
                      cluster_config, grid_sync_config, pick_config, pick_quantize_config, read_all_config)
from .dp4a import Dp4aLaunch
from .gemv import GemvLaunch
from .gluon import GluonLaunch, padded_rows
from .prepass import PrepassLaunch
from .quantize import AMAX_MAX_PROGRAMS, BARRIER_WORDS, QuantizeLaunches, one_launch_tile
from .tensorcore import TensorCoreLaunch

__all__ = [
    "CONFIGS", "INTERPRETER_CONFIGS", "NUMERIC_CONTRACT", "QUANTIZE_CONFIGS", "RECIPE", "Dp4aConfig", "GemvConfig",
    "GluonConfig", "PrepassConfig", "QuantizeConfig", "TensorCoreConfig", "X_WORKSPACE_MAX_BYTES", "accumulation_model",
    "chunk_rows", "cluster_config", "grid_sync_config", "nvfp4_linear", "nvfp4_quantize", "pick_config",
    "pick_quantize_config", "read_all_config",
]

_X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FP4_DTYPES = tuple(d for d in (torch.uint8, getattr(torch, "float4_e2m1fn_x2", None)) if d is not None)
# _runtime.workspace names: int32 amax partials then the grid barrier's words (zeroed), fp32 global scales
_AMAX_PARTS = "nvfp4_linear.amax_parts"
_AMAX_WORDS = AMAX_MAX_PROGRAMS + BARRIER_WORDS
_GDEC = "nvfp4_linear.gdec"
# x as a path takes it: dequantized (fp16, fp32) or the DP4A path's int8 codes and scale bytes (uint8)
_DEQUANT = {torch.float16: "nvfp4_linear.x_fp16", torch.float32: "nvfp4_linear.x_fp32",
            torch.uint8: "nvfp4_linear.x_int8"}

_QPLANS = PlanCache("nvfp4_quantize")
_PLANS = PlanCache("nvfp4_linear")


# ---------------------------------------------------------------------------------------------------------------
# nvfp4_quantize
# ---------------------------------------------------------------------------------------------------------------
def nvfp4_quantize(x: torch.Tensor, *, config: QuantizeConfig | None = None):
    """Quantize ``x`` to NVFP4 with the workload's recipe ("sol"), on the GPU, without host synchronisation.

    Args:
        x: torch float32 / bfloat16 / float16 tensor [..., K], contiguous, K a positive multiple of 16. Rows are
            the leading dimensions flattened: M = x.numel() // K.
        config: the quantize tile and amax form to force (``QuantizeConfig.AMAX``: "launch", two launches;
            "grid_sync", one cooperative launch, CUDA only, a grid of at most the SM count; "read_all", one launch,
            x of at most ``configs.READ_ALL_MAX_ELEMENTS`` padded elements; "cluster", one launch of one
            thread-block cluster, sm_90 or later, at most CLUSTER_CTAS tiles). Default: one launch of one program
            when x padded to powers of two has at most ``quantize.ONE_LAUNCH_MAX_ELEMENTS`` elements, else on sm_90
            ``cluster_config``'s tile where x is small enough, else ``read_all_config``'s, else on a GPU
            ``grid_sync_config``'s tile where its grid fits the SMs, else ``pick_quantize_config(M, K)``'s tile.
            The bytes do not depend on the choice.

    Returns:
        (x_fp4, x_scales, global_decode):
        x_fp4 uint8 [M, K/2]: E2M1 codes, two per byte, element 2i in bits 3:0;
        x_scales torch.float8_e4m3fn [M, K/16]: block scales, plain row-major;
        global_decode float32 [] (0-d tensor, on x's device).

    Rule (fp4ref.blockscale recipe "sol", the SOL-ExecBench nvfp4_linear_layer quantizer), all fp32, IEEE
    division, in this order: amax = max|x|; global_encode = min(2688 / amax, FLT_MAX), 1 if that is 0
    (amax = inf); global_decode = 1 / global_encode; block scale = E4M3FN_RNE(min((block_amax / 6) *
    global_encode, 448)); encode = min(1 / (block_scale * global_decode), FLT_MAX); code = E2M1_RNE(clamp(x *
    encode, -6, 6)), where [-0.25, 0) -> 0x8 and -0.0 -> 0x0. Bit for bit equal to fp4ref's for every finite
    input (zeros, ties, subnormal block scales and inputs, huge amax included). NaN and infinity in x are outside
    the contract: fp4ref's reference refuses them, and the kernels do not look for them (a pass over x).

    Raises:
        TypeError: x is not a tensor of a supported dtype; config is not a QuantizeConfig.
        ValueError: K not a positive multiple of 16, no rows, or x not contiguous; a "grid_sync" config under the
            CPU interpreter or with more programs than the device has SMs; a "read_all" config for a larger x; a
            "cluster" config off sm_90 (or later), under the CPU interpreter or with more tiles than CLUSTER_CTAS.
    """
    try:
        key = (x.shape, x.dtype, x.device, x.data_ptr() % 16 == 0, x.is_contiguous(), config)
        plan = _QPLANS.get(key)
    except (AttributeError, TypeError):  # not a tensor, or an unhashable config: refused below
        key = plan = None
    new = plan is None
    if new:
        M, K = _check_x(x)
        check_device(x, "x")
        if config is not None and not isinstance(config, QuantizeConfig):
            raise TypeError(f"config: expected a QuantizeConfig or None, got {type(config).__name__}")
        if config is not None and config.AMAX == "cluster" and not interpreting() and not _cluster_capable(x.device):
            raise ValueError(f"config={config}: the cluster form needs a CUDA device of compute capability 9.0 or "
                             f"later (thread-block clusters); x is on {x.device}")
        plan = QuantizeLaunches(M, K, _quantize_config(M, K, x.device) if config is None else config,
                                write_packed=True, write_dequant=False, max_programs=_max_programs(x.device))
    dev = x.device
    st = current_stream(dev)
    packed = torch.empty((plan.M, plan.K // 2), dtype=torch.uint8, device=dev)
    scales = torch.empty((plan.M, plan.K // 16), dtype=torch.uint8, device=dev)
    gdec = torch.empty((2,), dtype=torch.float32, device=dev)
    parts = workspace(dev, st, _AMAX_PARTS, _AMAX_WORDS, torch.int32, zeroed=True)
    plan.run(st, x, parts, packed, scales, gdec, gdec, 1.0)
    if new:
        _QPLANS.put(key, plan)
    return packed, scales.view(torch.float8_e4m3fn), gdec[0]


# The one-launch forms of the quantizer that the default picks, in this order, where x fits them (docs/kernels.md);
# () builds new plans with two launches instead (for A/B timing; the bytes are the same)
QUANTIZE_FORMS = ("cluster", "read_all", "grid_sync")


def _cluster_capable(device: torch.device) -> bool:
    """Whether ``device`` runs the quantizer's cluster form: CUDA, compute capability 9.0 or later (thread-block
    clusters, distributed shared memory), not the CPU interpreter. It assumes one cluster of 16 small CTAs (8 warps,
    a few KiB of shared memory) can be scheduled, as on a whole H100 / H200; where a partition cannot, the first
    launch fails with CUDA's cluster error, and ``QUANTIZE_FORMS`` without "cluster" restores the other forms."""
    return device.type == "cuda" and not interpreting() and torch.cuda.get_device_capability(device)[0] >= 9


def _max_programs(device: torch.device) -> int | None:
    """The largest grid-barrier grid on ``device``: its SM count (None off CUDA)."""
    return num_sms(device) if device.type == "cuda" else None


def _quantize_config(M: int, K: int, device: torch.device) -> QuantizeConfig | None:
    """The quantizer's default: None (one launch of one program, ``quantize.one_launch_tile``) where x is small
    enough; then the first of QUANTIZE_FORMS that takes x: on sm_90 ``cluster_config``'s tile (one launch of one
    thread-block cluster), ``read_all_config``'s (one launch), on a GPU ``grid_sync_config``'s (one cooperative
    launch, its grid within the SMs); else ``pick_quantize_config``'s tile (two launches)."""
    if one_launch_tile(M, K) is not None:
        return None
    for form in QUANTIZE_FORMS:
        if form == "cluster":
            cfg = cluster_config(M, K) if _cluster_capable(device) else None
        elif form == "read_all":
            cfg = read_all_config(M, K)
        elif device.type == "cuda" and not interpreting():
            cfg = grid_sync_config(M, K, num_sms(device))
        else:
            cfg = None
        if cfg is not None:
            return cfg
    return pick_quantize_config(M, K)


# ---------------------------------------------------------------------------------------------------------------
# nvfp4_linear
# ---------------------------------------------------------------------------------------------------------------
X_WORKSPACE_MAX_BYTES = 16 * 2**20  # the dequantized-x workspace's cap (a larger x goes in row chunks)


def chunk_rows(M: int, K: int, itemsize: int, cap: int | None = None) -> int:
    """Rows of x per chunk so that the dequantized chunk (rows x K x itemsize bytes) fits ``cap`` (default
    ``X_WORKSPACE_MAX_BYTES``): M itself when all of x fits, else the largest multiple of 256 rows that fits (the
    large-M tiles' row count), at least one row."""
    cap = X_WORKSPACE_MAX_BYTES if cap is None else cap
    rows = max(1, cap // (K * itemsize))
    if rows >= M:
        return M
    return rows - rows % 256 if rows >= 256 else rows


class _LinearPlan:
    """The launches of one nvfp4_linear call shape: the quantizer (into the dequantized-x workspace) and a path;
    or, where x dequantized would exceed X_WORKSPACE_MAX_BYTES, one amax over all of x and then, per chunk of
    rows, the quantizer and the path (``chunks``: (first row, end row, QuantizeLaunches, path launch))."""

    __slots__ = ("quant", "path", "chunks", "deq_name", "deq_dtype", "quant_w_gdec", "int8_x", "out_shape", "numel",
                 "K", "N")

    def _x_outputs(self, buf, gdec, path):
        """The quantizer's (q, s, deq) in the x workspace ``buf`` for the rows of ``path``: the DP4A path's int8
        codes then scale bytes (``Dp4aLaunch.x_views``), or the others' dequantized x (``gdec`` fills the unused
        outputs)."""
        if self.int8_x:
            q, s, _ = path.x_views(buf)
            return q, s, gdec
        return gdec, gdec, buf

    def run(self, x, weight_fp4, weight_scales, w_gdec: float, out):
        dev = x.device
        st = current_stream(dev)
        if out is None:
            out = torch.empty(self.out_shape, dtype=torch.bfloat16, device=dev)
        parts = workspace(dev, st, _AMAX_PARTS, _AMAX_WORDS, torch.int32, zeroed=True)
        gdec = workspace(dev, st, _GDEC, 2, torch.float32)
        deq = workspace(dev, st, self.deq_name, self.numel, self.deq_dtype)
        # gdec = [x global decode, fp32(x global decode * w_gdec)] (the pre-pass GEMM's epilogue scale)
        wq = w_gdec if self.quant_w_gdec else 1.0
        if self.chunks is None:
            self.quant.run(st, x, parts, *self._x_outputs(deq, gdec, self.path), gdec, wq)
            self.path.run(st, dev, weight_fp4, weight_scales, deq, gdec, out, w_gdec)
            return out
        # the recipe's global amax is over all of x: one amax launch, then every chunk quantizes with it. Each row's
        # codes, scales and products are those of the unchunked call (same config for every chunk): same bits.
        self.quant.run_amax(st, x, parts)
        x2, out2 = x.view(-1, self.K), out.view(-1, self.N)
        for r0, r1, quant, path in self.chunks:
            quant.run_quant(st, x2[r0:r1], parts, self.quant.nprog, *self._x_outputs(deq, gdec, path), gdec, wq)
            path.run(st, dev, weight_fp4, weight_scales, deq, gdec, out2[r0:r1], w_gdec)
        return out


def nvfp4_linear(x: torch.Tensor, weight_fp4: torch.Tensor, weight_scales: torch.Tensor,
                 weight_global_decode_scale: float, *, config=None, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = NVFP4(x) @ NVFP4(W)^T, the SOL-ExecBench nvfp4_linear_layer op, for Hopper (exact decode to fp16).

    Args:
        x: bfloat16 (or float16 / float32) [..., K], contiguous, finite; quantized per call with the "sol"
            recipe. A NaN or infinity in x is outside the contract (the recipe's global scale is undefined; fp4ref's
            reference refuses such x): the kernels do not look for one, since that costs a pass over x, and y is
            then unspecified.
        weight_fp4: torch.float4_e2m1fn_x2 or uint8 [N, K/2], E2M1 codes, element 2i in bits 3:0; contiguous,
            16-byte aligned.
        weight_scales: torch.float8_e4m3fn (or uint8 bytes) [N, K/16], plain row-major block scales (sign bit
            ignored: UE4M3); contiguous, 16-byte aligned.
        weight_global_decode_scale: a real number (python or numpy float or int), rounded to fp32 once (RNE);
            that fp32 value must be finite and positive.
        config: a GluonConfig or Dp4aConfig (CUDA only, ``.fits(N, K)``), GemvConfig, TensorCoreConfig or
            PrepassConfig to force (default: ``pick_config(M, N, K)``).
        out: optional bfloat16 [..., N] contiguous tensor to write y into (tests pass a NaN-filled one).

    Returns:
        y bfloat16 [..., N] = RNE_bf16(fp32(acc) * fp32(x_gdec * w_gdec)), acc = sum_k xq[m,k] * wq[n,k] with
        exact products and fp32 accumulation (``accumulation_model(config, K)``; NUMERIC_CONTRACT). Any M >= 1;
        N, K multiples of 16. Workspaces (per device and stream; ``_runtime.clear_workspaces()`` frees them): x
        dequantized (2 M K bytes, 4 M K for the GEMV; the DP4A path's int8 codes and scale bytes, 17/16 M K; at
        most X_WORKSPACE_MAX_BYTES = 16 MiB: a larger x is quantized and multiplied in chunks of ``chunk_rows`` rows
        after one amax over all of x, same bits), split-K partials of the Gluon and DP4A paths (4 SPLIT_K BM BN
        bytes per output tile, BM at least 8 for the DP4A path); the PrepassConfig
        path (CPU interpreter at M > 256, shapes the Gluon path cannot take; never chunked) also keeps a decoded
        weight of 2 N K bytes (128 MiB at N = K = 8192) and x dequantized whole.

    Raises:
        TypeError: wrong tensor types or dtypes, config of another type.
        ValueError: shapes inconsistent, K or N not a multiple of 16, tensors on different devices, not
            contiguous or not 16-byte aligned; weight_global_decode_scale not finite and positive; ``out``
            overlapping an input in memory.
    """
    w_gdec = weight_global_decode_scale
    try:
        key = (x.shape, x.dtype, x.device, x.data_ptr() % 16 == 0, x.is_contiguous(),
               weight_fp4.shape, weight_fp4.dtype, weight_fp4.device, weight_fp4.data_ptr() % 16 == 0,
               weight_fp4.is_contiguous(), weight_scales.shape, weight_scales.dtype, weight_scales.device,
               weight_scales.data_ptr() % 16 == 0, weight_scales.is_contiguous(), type(w_gdec), config,
               None if out is None else (out.shape, out.dtype, out.device, out.data_ptr() % 16 == 0,
                                         out.is_contiguous()))
        plan = _PLANS.get(key)
    except (AttributeError, TypeError):  # an argument that is no tensor, or an unhashable config: refused below
        key = plan = None
    if key is not None and out is not None:  # (key is None when an argument is no tensor: refused below)
        check_no_overlap(out, "out", x=x, weight_fp4=weight_fp4, weight_scales=weight_scales)
    # (a plan exists only for a key whose first call validated, the scale's type included; its value is per call)
    if plan is not None and _w_gdec_in_range(w_gdec):
        return plan.run(x, weight_fp4, weight_scales, float(w_gdec), out)

    M, K = _check_x(x)
    N = _check_weight(x, weight_fp4, weight_scales, K)
    _check_w_gdec(w_gdec)
    cfg = pick_config(M, N, K) if config is None else config
    if not isinstance(cfg, (GluonConfig, Dp4aConfig, GemvConfig, TensorCoreConfig, PrepassConfig)):
        raise TypeError(f"config: expected a GluonConfig, Dp4aConfig, GemvConfig, TensorCoreConfig, PrepassConfig or "
                        f"None, got {type(cfg).__name__}")
    if isinstance(cfg, (GluonConfig, Dp4aConfig)) and (x.device.type != "cuda" or not cfg.fits(N, K)):
        raise ValueError(f"config={cfg}: the Gluon and DP4A paths run on CUDA (sm_90) with K % 256 == 0 and "
                         f"(K / 256) % SPLIT_K == 0; got K={K} on {x.device}")
    out_shape = (*x.shape[:-1], N)
    if out is not None and (not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16
                            or tuple(out.shape) != out_shape or not out.is_contiguous() or out.device != x.device):
        raise ValueError(f"out: expected a contiguous bfloat16 tensor of shape {out_shape} on {x.device}, "
                         f"got {getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}")

    plan = _LinearPlan()
    plan.out_shape, plan.K, plan.N = out_shape, K, N
    # the quantizer writes x dequantized (code * block scale, exact) in the dtype the path multiplies: fp32 for the
    # GEMV's FMAs, fp16 for the tensor cores; the DP4A path takes int8 codes and scale bytes instead (uint8)
    plan.int8_x = isinstance(cfg, Dp4aConfig)
    plan.deq_dtype = torch.uint8 if plan.int8_x else torch.float32 if isinstance(cfg, GemvConfig) else torch.float16
    plan.deq_name = _DEQUANT[plan.deq_dtype]
    # the pre-pass, Gluon and DP4A paths' epilogues read gdec[1] = fp32(x_gdec * w_gdec), written by the quantizer
    plan.quant_w_gdec = isinstance(cfg, (PrepassConfig, GluonConfig, Dp4aConfig))
    # the Gluon path takes x in its K order, and starts under the quantize launch (programmatic dependent launch:
    # the quantizer triggers it when it starts, 1, or after its stores, 2; the GEMM waits for the quantizer's grid
    # before it reads x; gluon.py)
    gluon_path = isinstance(cfg, GluonConfig)
    trigger = (1 if cfg.EARLY_START else 2) if isinstance(cfg, (GluonConfig, Dp4aConfig)) else 0
    launch_type = {GluonConfig: functools.partial(GluonLaunch, pdl=True), Dp4aConfig: functools.partial(Dp4aLaunch,
                   pdl=True), GemvConfig: GemvLaunch, TensorCoreConfig: TensorCoreLaunch,
                   PrepassConfig: PrepassLaunch}[type(cfg)]

    # row chunks where x dequantized would exceed the cap; not for the pre-pass path (it decodes all of W per
    # launch, which chunks would repeat)
    # (DP4A: 17/16 byte per element, counted as 2)
    itemsize = 2 if plan.int8_x else plan.deq_dtype.itemsize
    rows = M if isinstance(cfg, PrepassConfig) else chunk_rows(M, K, itemsize)

    def path_launch(h: int):
        if not gluon_path:
            return launch_type(cfg, h, N, K)
        # x spans whole BM-row tiles where they fit the workspace cap: a TMA box past x's last row is slow
        padded = padded_rows(cfg, h)
        return launch_type(cfg, h, N, K, x_rows=padded if padded * K * itemsize <= X_WORKSPACE_MAX_BYTES else h)

    # (chunked: its amax launch over all of x only, so the two-launch form)
    plan.quant = QuantizeLaunches(M, K, _quantize_config(M, K, x.device) if rows == M else
                                  pick_quantize_config(M, K), write_packed=plan.int8_x,
                                  write_dequant=not plan.int8_x, permute_k=gluon_path,
                                  trigger_dependents=trigger, int8_codes=plan.int8_x)
    if rows == M:
        plan.chunks, plan.path = None, path_launch(M)
        paths = [plan.path]
    else:
        launches = {}  # one QuantizeLaunches + path launch per chunk height (the full one and the last)
        plan.chunks = []
        for r0 in range(0, M, rows):
            h = min(rows, M - r0)
            if h not in launches:
                launches[h] = (QuantizeLaunches(h, K, pick_quantize_config(h, K), write_packed=plan.int8_x,
                                                write_dequant=not plan.int8_x, permute_k=gluon_path,
                                                trigger_dependents=trigger, int8_codes=plan.int8_x),
                               path_launch(h))
            plan.chunks.append((r0, r0 + h, *launches[h]))
        plan.path = None
        paths = [path for _, path in launches.values()]
    x_rows = max(path.x_rows for path in paths) if gluon_path else rows
    plan.numel = x_rows * K + (rows * K // 16 if plan.int8_x else 0)  # DP4A: the scale bytes after the codes
    y = plan.run(x, weight_fp4, weight_scales, float(w_gdec), out)
    if key is not None:
        _PLANS.put(key, plan)
    return y


# ---------------------------------------------------------------------------------------------------------------
# Argument checks (first call of a shape)
# ---------------------------------------------------------------------------------------------------------------
def _check_x(x, name: str = "x") -> tuple[int, int]:
    """(M, K) of x [..., K]; raises TypeError / ValueError as the public functions document."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _X_DTYPES:
        raise TypeError(f"{name}.dtype={x.dtype}: expected one of torch.float32, torch.bfloat16, torch.float16")
    if x.dim() < 1:
        raise ValueError(f"{name}.shape={tuple(x.shape)}: expected [..., K] with at least one dimension")
    K = x.shape[-1]
    if K == 0 or K % 16:
        raise ValueError(f"{name}.shape[-1]=K={K}: expected a positive multiple of 16 (NVFP4 blocks of 16 along K)")
    if x.numel() == 0:
        raise ValueError(f"{name}.shape={tuple(x.shape)}: expected at least one row")
    if not x.is_contiguous():
        raise ValueError(f"{name} is not contiguous (strides {x.stride()}): pass x.contiguous()")
    return x.numel() // K, K


def _check_weight(x, weight_fp4, weight_scales, K: int) -> int:
    """N of the NVFP4 weight; raises TypeError / ValueError as nvfp4_linear documents."""
    check_device(x, "x")
    for name, t in (("weight_fp4", weight_fp4), ("weight_scales", weight_scales)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name}.shape={tuple(t.shape)}: expected 2 dimensions")
        if t.device != x.device:
            raise ValueError(f"{name}.device={t.device}: expected x's device {x.device}")
    if weight_fp4.dtype not in _FP4_DTYPES:
        raise TypeError(f"weight_fp4.dtype={weight_fp4.dtype}: expected torch.float4_e2m1fn_x2 or torch.uint8")
    if weight_scales.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise TypeError(f"weight_scales.dtype={weight_scales.dtype}: expected torch.float8_e4m3fn or torch.uint8")
    N = weight_fp4.shape[0]
    if N == 0 or N % 16:
        raise ValueError(f"weight_fp4.shape[0]=N={N}: expected a positive multiple of 16")
    if tuple(weight_fp4.shape) != (N, K // 2):
        raise ValueError(f"weight_fp4.shape={tuple(weight_fp4.shape)}: expected (N, K/2)=({N}, {K // 2}) for x K={K}")
    if tuple(weight_scales.shape) != (N, K // 16):
        raise ValueError(f"weight_scales.shape={tuple(weight_scales.shape)}: expected (N, K/16)=({N}, {K // 16})")
    for name, t in (("weight_fp4", weight_fp4), ("weight_scales", weight_scales)):  # layout after shape
        if not t.is_contiguous():
            raise ValueError(f"{name} is not contiguous (strides {t.stride()})")
        if t.data_ptr() % 16:
            raise ValueError(f"{name}.data_ptr() % 16 = {t.data_ptr() % 16}: expected a 16-byte aligned base (the "
                             "kernels read it in 4-16-byte words; .clone() aligns it)")
    return N


# The reals whose fp32 rounding (RNE) is finite and positive: above half the smallest fp32 subnormal (2^-150 ties
# to 0) and below the overflow threshold 2^128 - 2^103 (the fp32 max plus half an ulp)
_W_GDEC_MIN = 2.0**-150
_W_GDEC_OVERFLOW = 2.0**128 - 2.0**103


def _w_gdec_in_range(w_gdec) -> bool:
    """Whether a real ``w_gdec`` rounds to a finite positive fp32 value. A numpy scalar compared with these Python
    floats would cast them to its own dtype (NEP 50: 2^128 - 2^103 overflows float32), so it is compared as the
    Python float it equals exactly."""
    value = float(w_gdec) if isinstance(w_gdec, np.floating) else w_gdec
    return _W_GDEC_MIN < value < _W_GDEC_OVERFLOW


def _check_w_gdec(w_gdec) -> None:
    if isinstance(w_gdec, bool) or not isinstance(w_gdec, numbers.Real):
        # a tensor would need a device-to-host copy (a synchronisation) on every call: the caller makes it once
        hint = "; pass float(t) once (a tensor would be read back from the device on every call)" if isinstance(
            w_gdec, torch.Tensor) else ""
        raise TypeError(f"weight_global_decode_scale: expected a real number, got {type(w_gdec).__name__}{hint}")
    if not _w_gdec_in_range(w_gdec):
        raise ValueError(f"weight_global_decode_scale={w_gdec!r}: expected a positive number that stays finite "
                         "and nonzero in fp32 (the recipe's global decode scale, e.g. amax / (448 * 6))")
