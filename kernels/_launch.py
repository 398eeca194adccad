"""Host launch helpers shared by the project's kernels: launch a kept CompiledKernel without Triton's per-call work.

Why. After a plan's first call (through the JIT, which compiles and validates), later calls launch the kept
CompiledKernel. Through ``ck.run`` Triton still (a) allocates no-op scratch, (b) for each host TensorDescriptor
argument re-encodes a CUtensorMap with cuTensorMapEncodeTiled (~7 us each on the H200 machine's CPU) and (c) for
each tensor argument calls ``data_ptr()`` and cuPointerGetAttribute. ``RawLauncher`` calls Triton's generated C
launch function directly with descriptors encoded ONCE (the caller caches the encodings per data pointer: a plan
fixes shapes, strides, dtypes and block shapes, so an encoding depends only on the pointer) and may be given
plain integer pointers (the C launcher takes a Python int as the device address as is).

Requirements (checked by ``raw_launcher``, which returns False when one fails; callers then use Triton's normal
path, ``launch_compiled``, with the same arguments, so behaviour is the same, only slower):
- Triton's NVIDIA driver of the 3.4-3.6 shape: ``CudaLauncher.launch`` is either the C function itself (kernel
  without descriptors) or ``wrap_handle_tensordesc``'s closure over it (free variable ``launcher``), the base
  argument format has 13 entries, ``make_tensordesc_arg`` exists;
- the kernel's host descriptors are its FIRST ``n_desc`` parameters, lowered to TMA (one tensordesc_meta entry
  each);
- no global or profile scratch, one CTA per program (the scratch pointers passed are None).
A launch-hook (``triton.knobs.runtime.launch_enter_hook`` / ``launch_exit_hook``) makes ``hooks_installed()``
true: callers then take ``launch_compiled``, which builds the launch metadata the hooks expect.
"""
from __future__ import annotations

from triton import knobs

__all__ = ["RawLauncher", "raw_launcher", "launch_compiled", "hooks_installed", "tensor_desc"]


def hooks_installed() -> bool:
    """Whether a Triton launch enter/exit hook is installed (then launches must go through launch_compiled)."""
    rt = knobs.runtime
    return bool(getattr(rt.launch_enter_hook, "calls", True) or getattr(rt.launch_exit_hook, "calls", True))


def launch_compiled(ck, grid, stream, all_args) -> None:
    """Triton's own launch of a CompiledKernel (``ck.run``; encodes host descriptors on every call).

    ``all_args``: the kernel's arguments in parameter order, runtime ones then constexprs (what ``ck.run`` takes
    after the launch header); hooks, if installed, get their metadata as through the JIT."""
    enter, exit_ = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    if getattr(enter, "calls", True) or getattr(exit_, "calls", True):  # hooks installed: triton builds metadata
        meta = ck.launch_metadata(grid, stream, *all_args)
    else:
        meta, enter, exit_ = None, None, None
    ck.run(grid[0], grid[1], grid[2], stream, ck.function, ck.packed_metadata, meta, enter, exit_, *all_args)


def tensor_desc(base, shape, strides, block_shape, validate: bool):
    """A host TensorDescriptor; validate=False skips the dataclass checks (done on the plan's first call)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if validate:
        return TensorDescriptor(base, shape, strides, block_shape)
    d = object.__new__(TensorDescriptor)
    d.base, d.shape, d.strides, d.block_shape, d.padding = base, shape, strides, block_shape, "zero"
    return d


class RawLauncher:
    """Direct launches of one CompiledKernel through Triton's C launch function (see the module docstring).

    ``fn(*head(grid, stream), *encoded_descriptors, *other_args)`` launches; ``other_args`` are the kernel's
    remaining arguments in parameter order, constexprs included (the C launcher parses and ignores them)."""

    __slots__ = ("fn", "ck", "n_desc", "_base")

    def __init__(self, fn, ck, n_desc: int, run):
        self.fn, self.ck, self.n_desc = fn, ck, n_desc
        # after (gridX, gridY, gridZ, stream): function, cooperative grid, PDL, global and profile scratch (none),
        # packed metadata, launch metadata and hooks (none: callers check hooks_installed())
        self._base = (ck.function, run.launch_cooperative_grid, run.launch_pdl, None, None, ck.packed_metadata,
                      None, None, None)

    def head(self, grid, stream) -> tuple:
        """The launch header for ``grid`` (3 ints) on ``stream``: prebuild it once per (plan, stream)."""
        return (grid[0], grid[1], grid[2], stream, *self._base)

    def encode(self, descs) -> tuple:
        """The C launcher's arguments for the kernel's ``n_desc`` host descriptors (CUtensorMap, shape, strides
        each), as Triton's launcher wrapper computes them. Cache the result per data pointer(s)."""
        from triton.backends.nvidia import driver as drv  # looked up per call: tests replace make_tensordesc_arg

        tmeta = self.ck.metadata.tensordesc_meta
        return tuple(x for d, m in zip(descs, tmeta, strict=True) for x in drv.make_tensordesc_arg(d, m))


def raw_launcher(ck, n_desc: int):
    """A RawLauncher for CompiledKernel ``ck`` whose first ``n_desc`` parameters are host tensor descriptors, or
    False when this Triton's launcher does not have the shape the module docstring lists (then use
    launch_compiled)."""
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
              and not run.profile_scratch_size and run.num_ctas == 1)
    except Exception:  # pragma: no cover - depends on the Triton version
        return False
    return RawLauncher(fn, ck, n_desc, run) if ok else False
