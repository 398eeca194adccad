"""Compile a Triton kernel for sm_90 (Hopper: H100/H200) on a machine without a GPU.

Why: the Triton CPU interpreter accepts programs that the GPU compiler rejects (dot shapes with K < 16, tiny
M/N tiles, layouts wgmma cannot take). CI has no GPU, so every kernel config is also built here, ahead of time,
with triton's bundled ptxas; a kernel that only works interpreted cannot land.

Source of the recipe: /work/shared/facts/triton.md ("Compile for sm_90 without a GPU"); triton 3.6
``triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32))``.

Usage (in a test)::

    from fp4ref.kernels._sm90 import compile_for_sm90
    ck = compile_for_sm90(my_kernel,
                          signature={"a_ptr": "*fp16", "M": "i32", "BLOCK_M": "constexpr"},
                          constexprs={"BLOCK_M": 64}, num_warps=4, num_stages=3)
    assert ck.asm["cubin"]

Nothing runs at import.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

__all__ = ["SM90_TARGET_ARCH", "compile_for_sm90"]

SM90_TARGET_ARCH = 90  # compute capability 9.0 (Hopper), warp size 32


def _as_jit_function(kernel: Any):
    """Return a ``JITFunction`` for ``kernel``.

    Under TRITON_INTERPRET=1, ``@triton.jit`` returns an ``InterpretedFunction`` (a wrapper for the CPU
    interpreter) that the compiler cannot take; rebuild a ``JITFunction`` from the same Python function. Helper
    ``@triton.jit`` functions called from inside the kernel are resolved by the compiler from the kernel's globals,
    so under the interpreter a kernel that calls other jitted helpers cannot be compiled this way: keep compiled
    kernels self-contained (or compile with TRITON_INTERPRET unset).
    """
    from triton.runtime.jit import JITFunction

    if isinstance(kernel, JITFunction):
        return kernel
    fn = getattr(kernel, "fn", None)
    if fn is None or not callable(fn):
        raise TypeError(
            f"kernel={kernel!r}: expected a @triton.jit function (JITFunction or InterpretedFunction)"
        )
    return JITFunction(fn)


def compile_for_sm90(
    kernel: Any,
    signature: Mapping[str, str],
    constexprs: Mapping[str, Any] | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
    **options: Any,
):
    """Build ``kernel`` for sm_90 (CUDA, warp size 32) without a GPU and return the compiled kernel.

    Args:
        kernel: a ``@triton.jit`` function (a JITFunction, or an InterpretedFunction under TRITON_INTERPRET=1).
        signature: every kernel parameter name -> Triton type string, in any order, e.g. ``"*fp16"``,
            ``"*fp32"``, ``"*u8"``, ``"i32"``, ``"i64"``, ``"fp32"``; constexpr parameters as ``"constexpr"``.
            Parameters missing from ``signature`` but present in ``constexprs`` are added as ``"constexpr"``.
        constexprs: constexpr parameter name -> value (int, bool, or a triton dtype).
        num_warps: warps per CTA (wgmma needs a multiple of 4).
        num_stages: software-pipelining depth.
        **options: further CUDA backend options passed through (e.g. ``maxnreg``).

    Returns:
        triton.compiler.CompiledKernel; ``.asm["cubin"]`` holds the sm_90 binary, ``.asm["ptx"]`` the PTX,
        ``.metadata.shared`` the shared memory bytes used.

    Raises:
        TypeError: ``kernel`` is not a jitted function.
        ValueError: ``signature``/``constexprs`` name a parameter the kernel does not have, or leave one out.
        Any triton compile error (e.g. a dot shape that sm_90 rejects, too much shared memory) propagates.

    Notes:
        Uses triton's bundled ptxas; ~1 s per kernel. Set TRITON_CACHE_DIR to keep builds out of $HOME. The
        result is cached by triton on (source, signature, constexprs, options), so re-compiles are cheap.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    jit_fn = _as_jit_function(kernel)
    constexprs = dict(constexprs or {})
    params = list(jit_fn.arg_names)
    sig = dict(signature)
    for name in constexprs:
        sig.setdefault(name, "constexpr")
    unknown = sorted(set(sig) - set(params))
    if unknown:
        raise ValueError(f"signature/constexprs name unknown parameter(s) {unknown}; kernel parameters are {params}")
    missing = [p for p in params if p not in sig]
    if missing:
        raise ValueError(f"signature is missing parameter(s) {missing}; kernel parameters are {params}")
    not_given = [p for p in params if sig[p] == "constexpr" and p not in constexprs]
    if not_given:
        raise ValueError(f"constexprs is missing value(s) for {not_given}")
    ordered = {p: sig[p] for p in params}
    # ASTSource keys constexprs by (argument index,) paths.
    ce = {(params.index(name),): value for name, value in constexprs.items()}
    src = ASTSource(fn=jit_fn, signature=ordered, constexprs=ce)
    target = GPUTarget("cuda", SM90_TARGET_ARCH, 32)
    opts = {"num_warps": int(num_warps), "num_stages": int(num_stages), **options}
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(os.getcwd(), ".triton_cache"))
    return triton.compile(src, target=target, options=opts)
