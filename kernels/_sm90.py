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

import contextlib
import os
import sys
from typing import Any, Mapping

__all__ = ["SM90_TARGET_ARCH", "compile_for_sm90"]

SM90_TARGET_ARCH = 90  # compute capability 9.0 (Hopper), warp size 32


def _to_jit(obj: Any, cache: dict):
    """JITFunction for an InterpretedFunction (cached so every reference maps to one object)."""
    from triton.runtime.jit import JITFunction

    if isinstance(obj, JITFunction):
        return obj
    key = id(obj)
    if key not in cache:
        cache[key] = JITFunction(obj.fn, **getattr(obj, "kwargs", {}))
    return cache[key]


@contextlib.contextmanager
def _jit_functions_for_interpreted(kernel: Any):
    """Yield a JITFunction for ``kernel``, with every InterpretedFunction the compiler may meet swapped for one.

    Under TRITON_INTERPRET=1, ``@triton.jit`` returns ``InterpretedFunction`` objects, which the compiler cannot
    take: the kernel itself, helper kernels in its module, and triton.language's own jitted helpers (tl.cdiv,
    tl.sum, tl.max, ...). For the duration of the compile, those module attributes (triton.language.* modules and
    the globals of the kernel and of every helper reached) are replaced by JITFunctions built from the same Python
    functions, then restored. Not thread-safe (compile from one thread at a time).
    """
    from triton.runtime.jit import JITFunction

    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - triton without an interpreter
        InterpretedFunction = ()  # noqa: N806

    if isinstance(kernel, JITFunction):
        yield kernel
        return
    if not isinstance(kernel, InterpretedFunction) and not callable(getattr(kernel, "fn", None)):
        raise TypeError(f"kernel={kernel!r}: expected a @triton.jit function (JITFunction or InterpretedFunction)")
    cache: dict = {}
    patched: list = []  # (dict, name, old value)

    def patch_namespace(ns: dict) -> None:
        for name, val in list(ns.items()):
            if isinstance(val, InterpretedFunction):
                new = _to_jit(val, cache)
                patched.append((ns, name, val))
                ns[name] = new
                patch_namespace(new.fn.__globals__)

    try:
        for mod_name, mod in list(sys.modules.items()):
            if mod is not None and (mod_name == "triton.language" or mod_name.startswith("triton.language.")):
                patch_namespace(vars(mod))
        jit_fn = _to_jit(kernel, cache)
        patch_namespace(jit_fn.fn.__globals__)
        yield jit_fn
    finally:
        for ns, name, val in reversed(patched):
            ns[name] = val


def compile_for_sm90(
    kernel: Any,
    signature: Mapping[str, str],
    constexprs: Mapping[str, Any] | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
    divisible_by_16: Any = None,
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
        divisible_by_16: names of parameters the compiler may assume divisible by 16 (``tt.divisibility``), as
            the runtime JIT assumes for 16-byte aligned tensors and for ints that are multiples of 16 (strides,
            N, K). Default None: every pointer parameter (type ``*...``), no ints. Without these hints the
            compiler cannot prove 16-byte alignment, emits scalar loads and skips cp.async pipelining, so the
            build would not be the one the GPU runs: list the ints that are multiples of 16 at run time.
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

    with _jit_functions_for_interpreted(kernel) as jit_fn:
        return _compile(jit_fn, signature, constexprs, num_warps, num_stages, divisible_by_16, options)


def _compile(jit_fn, signature, constexprs, num_warps, num_stages, divisible_by_16, options):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

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
    if divisible_by_16 is None:
        divisible_by_16 = [p for p in params if str(ordered[p]).startswith("*")]
    bad = sorted(set(divisible_by_16) - set(params))
    if bad:
        raise ValueError(f"divisible_by_16 names unknown parameter(s) {bad}; kernel parameters are {params}")
    attrs = {(params.index(p),): [["tt.divisibility", 16]] for p in divisible_by_16}
    src = ASTSource(fn=jit_fn, signature=ordered, constexprs=ce, attrs=attrs)
    target = GPUTarget("cuda", SM90_TARGET_ARCH, 32)
    opts = {"num_warps": int(num_warps), "num_stages": int(num_stages), **options}
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(os.getcwd(), ".triton_cache"))
    return triton.compile(src, target=target, options=opts)
