"""The host runtime shared by the project's kernels: plans, launches, workspaces, device facts.

Every kernel package (gemm_fp16, sparse_gemm_fp4_fp8, nvfp4_linear) uses this module and nothing else for its host
plumbing:

* ``interpreting()``: whether kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1`` when the kernel
  modules were imported; Triton reads it when it decorates a kernel).
* ``num_sms(device)``: the multiprocessor count (cached); ``INTERPRETER_SMS`` in the CPU interpreter, so the
  persistent loops run several tiles per program there.
* ``current_stream(device)``: the raw CUDA stream handle Triton itself launches on (0 on the CPU); tensors on a
  CUDA device other than the current one are refused there (Triton launches on the current device).
* ``PlanCache``: a bounded dict of launch plans, one policy for every kernel (``MAX_PLANS`` entries, the oldest
  dropped first); ``clear_plans()`` empties every cache.
* ``workspace(device, stream, name, numel, dtype)``: scratch buffers per (device, stream), grown and never
  shrunk. Launches on one stream run in order, so they can share one; launches on different streams get
  different ones. ``zeroed=True`` buffers (split-K arrival counters) are zeroed once when allocated; the kernels
  leave them at zero.
* ``Launch``: one kernel launch of a plan. Its first call goes through Triton's JIT (compiles, validates, and
  hands back the CompiledKernel, which the Launch keeps); later calls launch the kept kernel directly. A
  Launch holds the geometry of its TMA descriptors (``Desc``: shapes, strides, blocks; the plan's key fixes
  them); a call passes only their base tensors.

Why direct launches. The JIT re-binds and re-specialises every argument on each call, tens of microseconds of Python
on the GPU machine's CPU, which a CUDA-event timing of a ~5 us kernel measures as kernel time (the GPU waits for the
launch). Triton's own launch of a CompiledKernel (``ck.run``) still re-encodes each host tensor descriptor
(cuTensorMapEncodeTiled, ~7 us each on that CPU) and calls cuPointerGetAttribute per tensor. With ``FAST_LAUNCH``
on, a Launch calls Triton's generated C launch function itself, with tensors as integer pointers and descriptor
encodings cached per base pointers (a Launch's descriptor geometry is fixed by its plan's key). A kept kernel is
valid for the plan that made it only if the plan's key fixes everything Triton specialises on: dtypes, ints equal to
1 or divisible by 16 (shapes and strides; M is ``do_not_specialize`` where it varies) and 16-byte pointer alignment.

The direct path needs Triton's NVIDIA launcher of the 3.4-3.6 shape (``raw_launcher`` checks it and returns
False otherwise; the Launch then uses ``ck.run``, which is only slower). A launch hook
(``triton.knobs.runtime.launch_enter_hook`` / ``launch_exit_hook``) sends launches through ``ck.run`` too, which
builds the metadata the hooks expect. Calls are CUDA-graph capturable after a first, uncaptured call of the same
plan (it compiles). Workspaces are per stream: a capture on another stream than that first call's (torch.cuda.graph
captures on one side stream of its own unless given one) allocates that stream's workspaces inside the capture,
and every graph captured on one stream shares them: replay such graphs one after another on one stream, not
concurrently on several.
"""
from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from triton import knobs

__all__ = [
    "FAST_LAUNCH", "GRID_X_MAX", "GRID_YZ_MAX", "INT32_OFFSETS", "INTERPRETER_SMS", "MAX_PLANS", "ConfigTable", "Desc",
    "Launch", "PlanCache", "check_device", "check_distinct_elements", "check_int32_offsets", "check_int_fields",
    "check_ints", "check_no_overlap", "clear_plans", "clear_workspaces", "cluster_metadata", "current_stream",
    "element_extent", "hooks_installed", "interpreting", "k_split", "launch_compiled", "num_sms", "raw_launcher",
    "workspace", "workspace_bytes",
]

# Launch kept kernels through Triton's C launch function (see the module docstring). False: Triton's ``ck.run``
# for every launch after the first (comparisons, debugging). Read at each launch.
FAST_LAUNCH = True
# Programs a persistent kernel starts per "SM" in the CPU interpreter: a few, so its tile loop runs several times.
INTERPRETER_SMS = 4
# Most plans one PlanCache keeps (the oldest is dropped past that): distinct shapes are few in a real model.
MAX_PLANS = 1024

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"  # as Triton read it when it decorated the kernels
# Keep the CompiledKernel after a Launch's first call (False: every call goes through the JIT; the host-time
# benchmark uses it to measure what the kept kernels save).
_KEEP_COMPILED = True


def interpreting() -> bool:
    """True when the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return _INTERPRET


def check_device(t: torch.Tensor, name: str) -> None:
    """A kernel argument must live where the kernels run: on a CUDA device, or on the CPU under the interpreter.

    Raises:
        ValueError: naming ``name`` (a CPU tensor without TRITON_INTERPRET=1, or any other device type).
    """
    if t.device.type == "cuda" or (t.device.type == "cpu" and _INTERPRET):
        return
    hint = (" (CPU tensors run in Triton's CPU interpreter: set TRITON_INTERPRET=1 before triton is first imported)"
            if t.device.type == "cpu" else "")
    raise ValueError(f"{name}.device={t.device}: expected a CUDA tensor{hint}")


_NUM_SMS: dict = {}


def num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA ``device`` (cached per device index); ``INTERPRETER_SMS`` on the CPU."""
    if device.type != "cuda":
        return INTERPRETER_SMS
    n = _NUM_SMS.get(device.index)
    if n is None:
        n = _NUM_SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton itself uses; no Stream object
_GET_DEVICE = getattr(torch._C, "_cuda_getDevice", None)  # torch.cuda.current_device() without its Python layers


def current_stream(device: torch.device) -> int:
    """The raw handle of ``device``'s current CUDA stream (0 for a CPU device); every kernel call takes its stream
    here.

    Raises:
        ValueError: ``device`` is a CUDA device other than the current one. Triton compiles for, loads into and
            launches on the current device, so tensors elsewhere would meet a kernel of another context (a launch
            error) or run unordered with their producers: call under ``torch.cuda.device(device)``.
    """
    if device.type != "cuda":
        return 0
    current = _GET_DEVICE() if _GET_DEVICE is not None else torch.cuda.current_device()
    if device.index is not None and device.index != current:
        raise ValueError(f"the tensors are on {device} but the current CUDA device is cuda:{current}: the kernels "
                         f"launch on the current device; call under torch.cuda.device({device.index})")
    return _RAW_STREAM(current) if _RAW_STREAM is not None else torch.cuda.current_stream(current).cuda_stream


GRID_X_MAX, GRID_YZ_MAX = 2**31 - 1, 65535  # a CUDA grid's dimensions
INT32_OFFSETS = 2**31  # `tl` kernels that index as row index * row stride (int32) reach elements below this


def element_extent(t: torch.Tensor) -> int:
    """Elements from a strided tensor's first to one past its last: 1 + sum((size - 1) * stride) (0 if empty)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((d - 1) * st for d, st in zip(t.shape, t.stride()) if d > 1)


def check_int32_offsets(path: str, **extents: int) -> None:
    """The operands of a ``path`` whose kernels index with 32-bit offsets (row index times row stride) must each
    extend over fewer than INT32_OFFSETS elements (``extents``: name -> ``element_extent`` or an element count).

    Raises:
        ValueError: naming the first operand that does not, and its extent."""
    for name, extent in extents.items():
        if extent >= INT32_OFFSETS:
            raise ValueError(f"{name} extends over {extent} elements: the {path} indexes it with 32-bit offsets "
                             f"(fewer than 2**31 elements); split the call along M")


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte addresses a strided tensor can touch."""
    p = t.data_ptr()
    # (contiguous, the usual case on every call of a kept plan: numel, no Python loop over the dimensions)
    n = t.numel() if t.is_contiguous() else element_extent(t)
    return (p, p + n * t.element_size())


def check_no_overlap(out: torch.Tensor, out_name: str, **inputs: torch.Tensor) -> None:
    """An output buffer must not share memory with an input: the kernels read inputs while other programs write
    the output, so an overlap is a race on the GPU. ValueError naming both when their byte spans intersect."""
    lo, hi = _span(out)
    for name, t in inputs.items():
        a, b = _span(t)
        if a < hi and lo < b and out.device == t.device:
            raise ValueError(f"{out_name} overlaps {name} in memory: give an output buffer of its own")


def check_distinct_elements(t: torch.Tensor, name: str) -> None:
    """ValueError naming ``t`` where two of its elements may share memory (a zero stride of a dimension longer than
    1, or strides that interleave): the kernels write every element of an output, so such a tensor would receive
    one element's value in place of another's. Sorted by stride, each dimension's stride must exceed the span of
    those before it."""
    extent = 0
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz > 1):
        if stride <= extent:
            raise ValueError(f"{name}: strides {tuple(t.stride())} for shape {tuple(t.shape)} make elements share "
                             "memory; give a tensor whose elements are distinct")
        extent += stride * (size - 1)


# ---------------------------------------------------------------------------------------------------------------
# Config tables
# ---------------------------------------------------------------------------------------------------------------
def check_ints(**values) -> None:
    """Raise TypeError naming the first of ``values`` (name=value) that is not an int (bools are not)."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}={v!r}: expected an int")


def check_int_fields(config, *names: str) -> None:
    """Raise TypeError naming the field unless each of ``config``'s fields ``names`` is an int (bools are not)."""
    check_ints(**{name: getattr(config, name) for name in names})


# The wgmma N widths a swap-AB tile may take: a power of two in 8..256 or the sum of two such (at most 256). Triton's
# tensors and TMA blocks are powers of two, so a two-part width runs as two boxes and two accumulators (gemm_fp16's
# and nvfp4_linear's Gluon kernels).
TILE_WIDTHS = tuple(sorted({a + b for a in (8, 16, 32, 64, 128, 256) for b in (0, 8, 16, 32, 64, 128)
                            if b < a and a + b <= 256}))


def m_parts(width: int) -> tuple[int, int]:
    """(high, low) wgmma N widths of a ``TILE_WIDTHS`` width: the largest power of two <= width and the rest (0 when
    width is a power of two)."""
    hi = 1 << (width.bit_length() - 1)
    return hi, width - hi


def check_tile_width(name: str, width: int) -> tuple[int, int]:
    """``m_parts(width)``, or ValueError naming ``name`` when ``width`` (an int) is not one of ``TILE_WIDTHS``."""
    if width not in TILE_WIDTHS:
        raise ValueError(f"{name}={width!r}: expected a power of two in 8..256 or the sum of two such (the wgmma N "
                         f"widths)")
    return m_parts(width)


def k_split(steps: int, split_k: int) -> tuple[int, int]:
    """(K steps per slice, slices launched) for ``steps`` K steps cut into at most ``split_k`` slices of equal
    length: the last slice may be shorter, none is empty (the split-K kernels launch no empty slice)."""
    per = -(-steps // min(split_k, steps))
    return per, -(-steps // per)


@dataclass(frozen=True)
class ConfigTable:
    """Configs chosen by M, the table shape every kernel package uses.

    ``rows``: (max_m, config) pairs with strictly increasing max_m; a call with M rows takes the first row whose
    max_m >= M. ``larger``: the config for every M above the last row. Configs are any frozen dataclasses (one
    type per path: the type says which path serves the call).
    """

    rows: tuple
    larger: Any

    def __post_init__(self):
        bounds = [m for m, _ in self.rows]
        if any(not isinstance(m, int) or m < 1 for m in bounds) or bounds != sorted(set(bounds)):
            raise ValueError(f"rows: expected strictly increasing positive int max_m values, got {bounds}")

    def pick(self, M: int):
        """The config for M rows (M >= 1)."""
        for max_m, cfg in self.rows:
            if M <= max_m:
                return cfg
        return self.larger

    def configs(self) -> list:
        """Every distinct config of the table, in order (CI compiles each for sm_90)."""
        return list(dict.fromkeys([c for _, c in self.rows] + [self.larger]))


# ---------------------------------------------------------------------------------------------------------------
# Plan caches
# ---------------------------------------------------------------------------------------------------------------
_CACHES: list = []


class PlanCache:
    """A bounded mapping key -> launch plan (``MAX_PLANS`` entries; past that the oldest entry is dropped).

    ``get(key)`` returns None for an unknown key; ``put`` stores a plan only once its call has validated. Every
    cache registers itself so that :func:`clear_plans` empties them all.
    """

    def __init__(self, name: str, max_plans: int | None = None):
        self.name = name
        self.max_plans = MAX_PLANS if max_plans is None else max_plans
        self._plans: OrderedDict = OrderedDict()
        _CACHES.append(self)

    def get(self, key):
        return self._plans.get(key)

    def put(self, key, plan) -> None:
        if len(self._plans) >= self.max_plans:
            self._plans.popitem(last=False)
        self._plans[key] = plan

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)

    def __contains__(self, key) -> bool:
        return key in self._plans


def clear_plans() -> None:
    """Forget every kernel package's launch plans (after changing a config table, or to free compiled kernels)."""
    for cache in _CACHES:
        cache.clear()


# ---------------------------------------------------------------------------------------------------------------
# Workspaces
# ---------------------------------------------------------------------------------------------------------------
_WORKSPACES: dict = {}


def workspace(device: torch.device, stream: int, name: str, numel: int, dtype: torch.dtype, *,
              zeroed: bool = False) -> torch.Tensor:
    """A flat scratch tensor of at least ``numel`` elements for (``device``, ``stream``, ``name``).

    Kept between calls and grown (never shrunk) when a call needs more; a grown buffer is a new tensor, so a
    caller must fetch it on every call rather than keep it. ``zeroed``: zero-filled when allocated (arrival
    counters and flags that every kernel leaves at zero); otherwise uninitialised. One dtype per name.
    """
    key = (device.type, device.index, stream, name)
    buf = _WORKSPACES.get(key)
    if buf is None or buf.numel() < numel:
        n = max(numel, 1 if buf is None else buf.numel())
        buf = (torch.zeros if zeroed else torch.empty)(n, dtype=dtype, device=device)
        _WORKSPACES[key] = buf
    elif buf.dtype != dtype:
        raise ValueError(f"workspace {name!r}: dtype {dtype} requested, but it holds {buf.dtype}")
    return buf


def unused_scratch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One-element fp32 and int32 tensors on ``device``, passed for a launch's split-K partials and arrival
    counters where it has no split tile (the kernel never touches them). They carry the dtypes the kernel declares
    because Triton types a pointer argument by the tensor passed and compiles a branch that no constexpr prunes:
    an fp16 output passed as the counters made the stream-K kernel's counter atomics fp16, which failed to build on
    the GPU. Kept per device (one pair; never freed), keyed by the device itself: a lookup on every call costs
    about as much as a cached attribute."""
    pair = _UNUSED_SCRATCH.get(device)
    if pair is None:
        pair = _UNUSED_SCRATCH[device] = (torch.zeros(1, dtype=torch.float32, device=device),
                                       torch.zeros(1, dtype=torch.int32, device=device))
    return pair


_UNUSED_SCRATCH: dict = {}


def split_scratch(device: torch.device, stream: int, partials_name: str, partials: int, counters_name: str,
                  counters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 partials, int32 arrival counters) of a split-K or stream-K launch: the workspaces (``workspace``)
    ``partials_name`` of ``partials`` elements and ``counters_name`` of ``counters`` (zero-filled when allocated;
    the kernels leave them at zero) on (``device``, ``stream``), or ``unused_scratch(device)`` when ``partials`` is 0
    (no split tile: the kernel never touches them)."""
    if not partials:
        return unused_scratch(device)
    return (workspace(device, stream, partials_name, partials, torch.float32),
            workspace(device, stream, counters_name, counters, torch.int32, zeroed=True))


def workspace_bytes() -> int:
    """Bytes held by every cached workspace (all devices and streams)."""
    return sum(b.numel() * b.element_size() for b in _WORKSPACES.values())


def clear_workspaces() -> None:
    """Free every cached workspace (calls on any stream allocate fresh ones). The launch plans go too
    (``clear_plans``): some keep views of the last workspace they used, which would keep its memory alive; the
    next call of each shape rebuilds its plan from Triton's cache of compiled kernels."""
    _WORKSPACES.clear()
    clear_plans()


# ---------------------------------------------------------------------------------------------------------------
# Launches
# ---------------------------------------------------------------------------------------------------------------
def hooks_installed() -> bool:
    """Whether a Triton launch enter/exit hook is installed (then launches go through ``ck.run``)."""
    rt = knobs.runtime
    return bool(getattr(rt.launch_enter_hook, "calls", True) or getattr(rt.launch_exit_hook, "calls", True))


def launch_compiled(ck, grid, stream, all_args, packed_metadata=None) -> None:
    """Triton's own launch of a CompiledKernel (``ck.run``; encodes host descriptors on every call).

    ``all_args``: the kernel's arguments in parameter order, runtime ones then constexprs (what ``ck.run`` takes
    after the launch header); hooks, if installed, get their metadata as through the JIT. ``packed_metadata``:
    the launcher's (num_warps, num_ctas, shared) in place of the kernel's (``cluster_metadata``)."""
    enter, exit_ = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    if getattr(enter, "calls", True) or getattr(exit_, "calls", True):  # hooks installed: triton builds metadata
        meta = ck.launch_metadata(grid, stream, *all_args)
    else:
        meta, enter, exit_ = None, None, None
    packed = ck.packed_metadata if packed_metadata is None else packed_metadata
    ck.run(grid[0], grid[1], grid[2], stream, ck.function, packed, meta, enter, exit_, *all_args)


def cluster_metadata(ck, cluster: int) -> tuple:
    """The launcher's packed metadata of ``ck`` (compiled for one CTA per program) with ``cluster`` in the place of
    num_ctas: Triton's launcher then launches gridX * cluster CTAs in clusters of ``cluster`` consecutive ones
    along x (16: it also allows the non-portable size). ValueError if the metadata is not (num_warps, 1, shared), or
    the kernel needs global or profile scratch (the launcher would size it for gridX * 1 CTAs)."""
    packed = tuple(ck.packed_metadata)
    if len(packed) != 3 or packed[1] != 1:
        raise ValueError(f"packed metadata {packed}: expected (num_warps, 1, shared) of a one-CTA kernel")
    scratch = [getattr(ck.metadata, n, 0) or 0 for n in ("global_scratch_size", "profile_scratch_size")]
    if any(scratch):
        raise ValueError(f"cluster launch of a kernel with scratch memory {scratch}: not supported")
    return (packed[0], cluster, packed[2])


class Desc:
    """The geometry of a host TMA descriptor parameter: global ``shape`` and ``strides`` (elements), the
    ``block_shape`` one TMA copy moves, for Gluon kernels the shared-memory ``layout`` (an NVMMASharedLayout) the
    copy writes, and ``dtype``, the dtype the base tensor is viewed as (None: its own; e.g. uint8 for NVFP4
    codes). A Launch holds one per descriptor parameter (``descs``: its plan's key fixes the geometry); each call
    passes only the base tensor, which the Launch turns into Triton's TensorDescriptor (Gluon's when a layout is
    given; checked on the first launch) or, on the direct path, into the cached encoding the C launcher takes."""

    __slots__ = ("shape", "strides", "block_shape", "layout", "dtype")

    def __init__(self, shape, strides, block_shape, layout=None, dtype: torch.dtype | None = None):
        self.shape, self.strides, self.block_shape = list(shape), list(strides), list(block_shape)
        self.layout, self.dtype = layout, dtype

    def tensor_descriptor(self, base: torch.Tensor, validate: bool):
        """Triton's descriptor of this geometry over ``base`` (validated by Triton when ``validate``)."""
        if self.dtype is not None and base.dtype != self.dtype:
            base = base.view(self.dtype)
        if self.layout is not None and validate:
            from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor

            return GluonTensorDescriptor(base, self.shape, self.strides, self.block_shape, self.layout)
        from triton.tools.tensor_descriptor import TensorDescriptor

        if validate:
            return TensorDescriptor(base, self.shape, self.strides, self.block_shape)
        # The checks ran on the plan's first launch; encoding needs only base, shape, strides and padding (the
        # block shape and swizzle come from the compiled kernel's metadata).
        d = object.__new__(TensorDescriptor)
        d.base, d.shape, d.strides, d.block_shape, d.padding = base, self.shape, self.strides, self.block_shape, "zero"
        return d

    @classmethod
    def parts(cls, shape, strides, block_shape, axis: int, layouts, dtype: torch.dtype | None = None):
        """The two descriptors of a tile in two parts along block axis ``axis`` (``m_parts``: a high part of the
        largest power of two, then the rest) over one tensor: the high part's box, then the low part's, each
        with its own layout (``layouts``: two). A one-part tile (its width a power of two) gets its first
        descriptor twice: the kernel takes both parameters and never reads the second."""
        hi, lo = m_parts(block_shape[axis])

        def part(width, layout):
            box = list(block_shape)
            box[axis] = width
            return cls(shape, strides, box, layout, dtype)

        first = part(hi, layouts[0])
        return first, (part(lo, layouts[1]) if lo else first)


class _Direct:
    """Triton's C launch function of one CompiledKernel, with the launch header it takes (see raw_launcher)."""

    __slots__ = ("fn", "ck", "base")

    def __init__(self, fn, ck, run, packed_metadata=None):
        self.fn, self.ck = fn, ck
        # after (gridX, gridY, gridZ, stream): function, cooperative grid, PDL, global and profile scratch (none),
        # packed metadata, launch metadata and hooks (none: callers check hooks_installed())
        packed = ck.packed_metadata if packed_metadata is None else packed_metadata
        self.base = (ck.function, run.launch_cooperative_grid, run.launch_pdl, None, None, packed, None, None, None)

    def encode(self, descs, bases) -> tuple:
        """The C launcher's arguments for host descriptors of geometries ``descs`` over ``bases`` (CUtensorMap,
        shape, strides each), as Triton's launcher wrapper computes them."""
        from triton.backends.nvidia import driver as drv  # looked up per call: tests replace make_tensordesc_arg

        tmeta = self.ck.metadata.tensordesc_meta
        return tuple(x for d, b, m in zip(descs, bases, tmeta, strict=True)
                     for x in drv.make_tensordesc_arg(d.tensor_descriptor(b, False), m))


def raw_launcher(ck, n_desc: int, packed_metadata=None):
    """A direct launcher for CompiledKernel ``ck`` whose first ``n_desc`` parameters are host descriptors, or False
    when this Triton's launcher does not have the expected shape: ``CudaLauncher.launch`` is the C function itself
    (no descriptors) or ``wrap_handle_tensordesc``'s closure over it (free variable ``launcher``), the base
    argument format has 13 entries, ``make_tensordesc_arg`` exists; no global or profile scratch (the cluster
    size travels in the packed metadata: ``ck``'s, or ``packed_metadata``)."""
    try:
        run = ck.run
        inner = run.launch
        tmeta = getattr(ck.metadata, "tensordesc_meta", None) or ()
        from triton.backends.nvidia.driver import _BASE_ARGS_FORMAT_LEN, make_tensordesc_arg  # noqa: F401

        if n_desc:
            cells = dict(zip(inner.__code__.co_freevars, (c.cell_contents for c in inner.__closure__ or ())))
            fn = cells.get("launcher")
        else:  # no descriptor: Triton uses the C function itself (a builtin, no Python code object)
            fn = None if hasattr(inner, "__code__") else inner
        ok = (fn is not None and len(tmeta) == n_desc and _BASE_ARGS_FORMAT_LEN == 13 and not run.global_scratch_size
              and not run.profile_scratch_size)
    except Exception:  # pragma: no cover - depends on the Triton version
        return False
    return _Direct(fn, ck, run, packed_metadata) if ok else False


def _allow_static_shared(ck) -> None:
    """Let a kernel that declares static shared memory in its PTX (kernels/_gluon.py's cluster exchange buffer) use
    its dynamic shared memory beside it: CUDA refuses a launch whose static + dynamic shared memory exceeds 48 KiB
    unless the function raises CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, which Triton does only when the
    dynamic part alone exceeds 48 KiB. Sets it to the kernel's dynamic size (``metadata.shared``).

    Raises:
        RuntimeError: the driver refused the attribute (static + dynamic above the device's opt-in maximum)."""
    import ctypes

    ck._init_handles()  # loads the module (no-op once loaded)
    max_dynamic_shared_size_bytes = 8  # CUfunction_attribute
    err = ctypes.CDLL("libcuda.so.1").cuFuncSetAttribute(
        ctypes.c_void_p(ck.function), ctypes.c_int(max_dynamic_shared_size_bytes), ctypes.c_int(ck.metadata.shared))
    if err:
        raise RuntimeError(f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, {ck.metadata.shared}) failed: "
                           f"CUresult {err}")


_MAX_ENCODINGS = 16  # descriptor encodings kept per Launch (a few operand pointers per plan: weights, buffers)


class Launch:
    """One kernel launch of a plan: ``kernel[grid](*args, **constexprs, **options)``, then the kept kernel.

    Args:
        kernel: the @triton.jit function.
        grid: 1-3 ints.
        constexprs: the kernel's constexpr arguments IN PARAMETER ORDER (they follow its runtime parameters).
        descs: the geometry (``Desc``) of each leading runtime parameter that is a host TMA descriptor, in order;
            each call passes the descriptor's base tensor in its place.
        cluster: > 1 launches the ``grid`` CTAs of a kernel compiled for one CTA per program as thread-block
            clusters of ``cluster`` consecutive CTAs along x (``cluster_metadata``; 2 .. 8 or 16, dividing grid[0];
            not with num_ctas; a GPU only): programs that exchange data through distributed shared memory. Launch
            hooks, where installed, see the grid in clusters (Triton's launcher multiplies x back).
        options: compile options (num_warps, num_stages, enable_fp_fusion, ...), used by the first launch.

    ``launch(stream, *args)``: ``args`` are the runtime arguments in parameter order (the base tensors of the
    ``descs`` first, then tensors, ints and floats); a call site passes tensors in the same places on every call
    (the direct path converts the places its first launch found; a tensor elsewhere goes to Triton's launcher as an
    object, which is slower, or off the direct path at a scalar parameter). The first call compiles through the JIT;
    on a CUDA device the CompiledKernel is kept and later calls launch it directly (module docstring), or through
    ``ck.run`` where that is not possible. In the CPU interpreter every call goes through the JIT.

    Raises:
        TypeError: a ``descs`` entry that is not a Desc.
        ValueError: a grid beyond CUDA's (GRID_X_MAX along x, GRID_YZ_MAX along y and z), naming the kernel; a
            ``cluster`` not 1 .. 8 or 16, not dividing grid[0] or given with num_ctas.
    """

    __slots__ = ("kernel", "grid", "constexprs", "options", "descs", "n_desc", "ck", "direct", "encodings", "ptrs",
                 "_tail", "cluster", "packed", "launch_grid")

    def __init__(self, kernel, grid, constexprs: dict, *, descs=(), cluster: int = 1, **options):
        self.kernel, self.constexprs, self.options = kernel, dict(constexprs), options
        self.descs = tuple(descs)
        if not all(isinstance(d, Desc) for d in self.descs):
            raise TypeError(f"descs: expected Desc geometries, got {[type(d).__name__ for d in self.descs]}")
        self.n_desc = len(self.descs)
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        if self.grid[0] > GRID_X_MAX or max(self.grid[1:]) > GRID_YZ_MAX:  # CUDA would refuse it at launch
            name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", "kernel")
            raise ValueError(f"{name}: grid {self.grid} exceeds CUDA's limits ({GRID_X_MAX} programs along x, "
                             f"{GRID_YZ_MAX} along y and z); split the call (e.g. along M)")
        check_ints(cluster=cluster)
        # (Triton's launcher allows the non-portable size 16 only; 9 .. 15 would fail at launch)
        with_ctas = cluster > 1 and options.get("num_ctas", 1) > 1
        if cluster not in (*range(1, 9), 16) or self.grid[0] % cluster or with_ctas:
            raise ValueError(f"cluster={cluster}: expected 1 .. 8 or 16 dividing grid[0]={self.grid[0]}, and not with "
                             "num_ctas")
        # Triton's launcher launches gridX * num_ctas CTAs: a cluster launch passes the grid in clusters along x
        self.cluster, self.packed = cluster, None
        self.launch_grid = (self.grid[0] // cluster, *self.grid[1:])
        self.ck: Any = None
        self.direct: Any = None  # None: not looked up yet; False: not possible with this Triton
        self.encodings: dict = {}
        self.ptrs: tuple | None = None  # positions of the tensor arguments after the descriptors (direct path)
        self._tail = tuple(self.constexprs.values())

    def launch(self, stream: int, *args) -> None:
        nd = self.n_desc
        ck = self.ck
        if ck is None:
            if self.cluster > 1 and _INTERPRET:
                raise ValueError(f"cluster={self.cluster}: the CPU interpreter has no thread-block clusters")
            descs = tuple(d.tensor_descriptor(b, True) for d, b in zip(self.descs, args[:nd], strict=True))
            if (self.options.get("num_ctas", 1) > 1 or self.cluster > 1) and not _INTERPRET:
                # compile, opt in to static beside dynamic shared memory, then launch (in clusters)
                ck = self.kernel.warmup(*descs, *args[nd:], grid=self.grid, **self.constexprs, **self.options)
                _allow_static_shared(ck)
                if self.cluster > 1:
                    self.packed = cluster_metadata(ck, self.cluster)
                launch_compiled(ck, self.launch_grid, stream, (*descs, *args[nd:], *self._tail), self.packed)
            else:
                # the interpreter runs the kernel in numpy: IEEE inf / NaN (1 / 0 of a padded block) are meant, not
                # warned
                with np.errstate(all="ignore") if _INTERPRET else contextlib.nullcontext():
                    ck = self.kernel[self.grid](*descs, *args[nd:], **self.constexprs, **self.options)
            if ck is not None and _KEEP_COMPILED and not _INTERPRET and getattr(ck, "run", None) is not None:
                self.ck = ck
            return
        direct = self.direct
        if direct is None and FAST_LAUNCH:  # (looked up once FAST_LAUNCH is on: it is read on every launch)
            direct = self.direct = raw_launcher(ck, nd, self.packed)
        if direct and FAST_LAUNCH and not hooks_installed():
            if nd:
                # a Launch's descriptors have fixed shapes, strides and blocks (its plan's key fixes them), so an
                # encoding depends only on the base pointers
                key = tuple([b.data_ptr() for b in args[:nd]])
                enc = self.encodings.get(key)
                if enc is None:
                    enc = direct.encode(self.descs, args[:nd])
                    if len(self.encodings) >= _MAX_ENCODINGS:
                        self.encodings.clear()
                    self.encodings[key] = enc
            else:
                enc = ()
            # tensors go as integer pointers; a plan's call site passes tensors in the same places every call, so
            # the first direct launch finds them and later ones only convert
            rest = list(args[nd:])
            ptrs = self.ptrs
            if ptrs is None:
                ptrs = self.ptrs = tuple(i for i, a in enumerate(rest) if isinstance(a, torch.Tensor))
            try:
                for i in ptrs:
                    rest[i] = rest[i].data_ptr()
            except AttributeError:  # a scalar where the first call had a tensor: convert by type
                rest = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args[nd:]]
            g = self.launch_grid
            try:
                direct.fn(g[0], g[1], g[2], stream, *direct.base, *enc, *rest, *self._tail)
                return
            except (TypeError, ValueError, SystemError):  # argument packing rejected: Triton's path from now on
                self.direct = False
        descs = tuple(d.tensor_descriptor(b, False) for d, b in zip(self.descs, args[:nd], strict=True))
        launch_compiled(ck, self.launch_grid, stream, (*descs, *args[nd:], *self._tail), self.packed)
