"""Compile a Triton kernel for sm_90 (Hopper: H100/H200) on a machine without a GPU.

Why: the Triton CPU interpreter accepts programs that the GPU compiler rejects (dot shapes with K < 16, tiny
M/N tiles, layouts wgmma cannot take). CI has no GPU, so every kernel config is also built here, ahead of time,
with triton's bundled ptxas; a kernel that only works interpreted cannot land.

Recipe (triton 3.6): ``triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", 90,
32))`` runs triton's bundled ptxas; Gluon kernels go through ``GluonASTSource`` the same way.

Usage (in a test)::

    from fp4ref.kernels._sm90 import compile_for_sm90
    ck = compile_for_sm90(my_kernel,
                          signature={"a_ptr": "*fp16", "M": "i32", "stride_am": "i32"},
                          constexprs={"BLOCK_M": 64}, num_warps=4, num_stages=3,
                          divisible_by_16=["a_ptr", "stride_am"])
    assert ck.asm["cubin"] and ck.metadata.shared <= SM90_MAX_SHARED_BYTES

Under TRITON_INTERPRET=1 (CPU tests) the build runs in a helper Python process started once per session with
TRITON_INTERPRET=0, because triton 3.6's interpreter leaves triton.language patched after an interpreted kernel
calls a jitted helper such as tl.cdiv (InterpretedFunction.__call__ never restores its patch scope), which breaks
any later in-process compile. The helper re-imports the kernel's module from its file.

Nothing runs at import.
"""
from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
import types
from typing import Any, Mapping, Sequence

__all__ = ["SM90_TARGET_ARCH", "SM90_MAX_SHARED_BYTES", "Sm90Build", "Sm90CompileError", "compile_for_sm90",
           "gluon_tensordesc", "ptxas_advisories", "sass_info"]

SM90_TARGET_ARCH = 90  # compute capability 9.0 (Hopper), warp size 32
SM90_MAX_SHARED_BYTES = 232448  # 227 KiB: the most dynamic shared memory one CTA may use on H100/H200


class Sm90CompileError(RuntimeError):
    """The sm_90 build failed (the message holds triton's error and the helper's traceback)."""


class Sm90Build(types.SimpleNamespace):
    """Result of a build in the helper process: ``asm`` (dict: "cubin" bytes, "ptx", "ttgir", ... str) and
    ``metadata`` (namespace: shared bytes, num_warps, num_ctas, num_stages, name, launch_cooperative_grid), like
    triton's CompiledKernel."""


def compile_for_sm90(
    kernel: Any,
    signature: Mapping[str, str],
    constexprs: Mapping[str, Any] | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
    divisible_by_16: Sequence[str] | None = None,
    **options: Any,
):
    """Build ``kernel`` for sm_90 (CUDA, warp size 32) without a GPU and return the compiled kernel.

    Args:
        kernel: a ``@triton.jit`` function (a JITFunction, or an InterpretedFunction under TRITON_INTERPRET=1) or a
            ``@gluon.jit`` function (built through Gluon's front end; ``gluon_tensordesc`` types its descriptors).
        signature: every runtime parameter name -> Triton type string, e.g. ``"*fp16"``, ``"*fp32"``, ``"*u8"``,
            ``"i32"``, ``"i64"``, ``"fp32"``, ``"tensordesc<fp16[128, 64]>"`` (host TensorDescriptor).
            Parameters given in ``constexprs`` may be left out (they are typed ``"constexpr"``).
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
        triton's CompiledKernel (in-process build) or an :class:`Sm90Build` (helper-process build): both have
        ``.asm["cubin"]`` (the sm_90 binary), ``.asm["ptx"]``, ``.asm["ttgir"]`` and ``.metadata.shared``
        (shared memory bytes; compare with SM90_MAX_SHARED_BYTES, which the compiler does not enforce).

    Raises:
        TypeError: ``kernel`` is not a jitted function.
        ValueError: ``signature``/``constexprs``/``divisible_by_16`` name a parameter the kernel does not have,
            or leave one out.
        triton.compiler.errors.CompilationError (in-process) or Sm90CompileError (helper process): the build
            failed, e.g. a dot shape that sm_90 rejects.

    Notes:
        Uses triton's bundled ptxas; ~1 s per kernel. Set TRITON_CACHE_DIR to keep builds out of $HOME.
    """
    fn = getattr(kernel, "fn", None)
    arg_names = getattr(kernel, "arg_names", None)
    if fn is None or not callable(fn) or arg_names is None:
        raise TypeError(f"kernel={kernel!r}: expected a @triton.jit function (JITFunction or InterpretedFunction)")
    request = _normalize(list(arg_names), signature, constexprs, divisible_by_16)
    opts = {"num_warps": int(num_warps), "num_stages": int(num_stages), **options}
    from triton.runtime.jit import JITFunction

    gluon = bool(getattr(kernel, "is_gluon", lambda: False)())
    # Gluon kernels are never interpreted, but an interpreted tl kernel earlier in the process would still break
    # an in-process build: under the interpreter they go to the helper process too.
    if isinstance(kernel, JITFunction) and not (gluon and os.environ.get("TRITON_INTERPRET") == "1"):
        return _compile(kernel, *request, opts)
    return _helper().compile(fn, request, opts)


def gluon_tensordesc(dtype: str, block_shape: Sequence[int], layout: Any) -> str:
    """The signature type of a Gluon host TMA descriptor argument: element type (``"fp16"``, ``"u8"``, ...), the
    block shape one copy moves, and its NVMMASharedLayout."""
    return f"tensordesc<{dtype}[{', '.join(str(int(b)) for b in block_shape)}],{layout!r}>"


def sass_info(cubin: bytes) -> dict:
    """Registers, stack bytes, spill stores/loads (STL/LDL) and the counts of a few instructions (HGMMA, QGMMA,
    IDP.4A, UTMALDG) of an sm_90 cubin, read with the cuobjdump bundled with triton; {} where it is not available."""
    import re
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    regs, stack = re.search(r"REG:(\d+)", res), re.search(r"STACK:(\d+)", res)
    count = lambda op: len(re.findall(r"\b" + op + r"\b", sass))  # noqa: E731
    return {"regs": int(regs.group(1)) if regs else None, "stack": int(stack.group(1)) if stack else None,
            "spill_stores": count("STL"), "spill_loads": count("LDL"), "hgmma": count("HGMMA"),
            "qgmma": count("QGMMA"), "idp": count(r"IDP\.4A"), "utmaldg": count("UTMALDG")}


def ptxas_advisories(ptx: str) -> list[str]:
    """The "Potential Performance Loss" advisories triton's bundled ptxas prints for ``ptx`` (sm_90a, ``-v``),
    e.g. C7513-C7515: "wgmma.mma_async instructions are serialized due to ..." (every wgmma of the kernel then
    waits for the previous one, so nothing overlaps the tensor cores). Triton's own build does not show them.
    [] where ptxas is not available."""
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(tool):
        return []
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        res = subprocess.run([tool, "-arch=sm_90a", "-v", src, "-o", os.path.join(d, "kernel.cubin")],
                             capture_output=True, text=True)
    return [line.split("ptxas info    : ", 1)[-1] for line in (res.stdout + res.stderr).splitlines()
            if "Potential Performance Loss" in line]


def _normalize(params, signature, constexprs, divisible_by_16):
    """Check names; return (signature in parameter order, constexprs by path, attrs)."""
    constexprs = dict(constexprs or {})
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
    if divisible_by_16 is None:
        divisible_by_16 = [p for p in params if str(ordered[p]).startswith("*")]
    bad = sorted(set(divisible_by_16) - set(params))
    if bad:
        raise ValueError(f"divisible_by_16 names unknown parameter(s) {bad}; kernel parameters are {params}")
    # ASTSource keys constexprs and attrs by (argument index,) paths.
    ce = {(params.index(name),): value for name, value in constexprs.items()}
    attrs = {(params.index(p),): [["tt.divisibility", 16]] for p in divisible_by_16}
    return ordered, ce, attrs


def _compile(jit_fn, ordered, ce, attrs, opts):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if getattr(jit_fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource

        src = GluonASTSource(fn=jit_fn, signature=ordered, constexprs=ce, attrs=attrs)
    else:
        src = ASTSource(fn=jit_fn, signature=ordered, constexprs=ce, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", SM90_TARGET_ARCH, 32), options=opts)


# ---------------------------------------------------------------------------------------------------------------
# Helper process (used under TRITON_INTERPRET=1)
# ---------------------------------------------------------------------------------------------------------------
# The helper reads length-prefixed pickled requests on stdin and writes length-prefixed pickled replies on stdout.
# A request names the kernel by (module name, source file, function name); the helper imports that file as that
# module (registering parent packages from the file's directories when they are not importable, as
# tests/conftest.py does for fp4ref.kernels), takes the JITFunction and builds it with _compile.
_HELPER_MAIN = r"""
import importlib, importlib.util, os, pickle, struct, sys, traceback, types
os.environ["TRITON_INTERPRET"] = "0"
sm90_path, = sys.argv[1:]
spec = importlib.util.spec_from_file_location("_fp4ref_sm90_helper", sm90_path)
sm90 = importlib.util.module_from_spec(spec); spec.loader.exec_module(sm90)
inp, out = sys.stdin.buffer, sys.stdout.buffer
sys.stdout = sys.stderr  # keep the reply channel clean

def ensure_package(name, directory):
    if not name or name in sys.modules:
        return
    try:
        importlib.import_module(name)
        return
    except ImportError:
        pass
    parent = name.rpartition(".")[0]
    ensure_package(parent, os.path.dirname(directory))
    init = os.path.join(directory, "__init__.py")
    spec = importlib.util.spec_from_file_location(name, init if os.path.exists(init) else None,
                                                  submodule_search_locations=[directory])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    if spec.loader is not None:
        spec.loader.exec_module(mod)

def load(modname, path):
    mod = sys.modules.get(modname)
    if mod is not None and os.path.abspath(getattr(mod, "__file__", "") or "") == os.path.abspath(path):
        return mod
    d = os.path.dirname(os.path.abspath(path))
    for p in (d, os.path.dirname(d), os.path.dirname(os.path.dirname(d))):
        if p not in sys.path:
            sys.path.append(p)
    if modname in ("__main__", "__mp_main__") or not modname:
        modname = "_fp4ref_sm90_kernel_" + str(abs(hash(path)))
    ensure_package(modname.rpartition(".")[0], d)
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    return mod

while True:
    head = inp.read(8)
    if len(head) < 8:
        break
    req = pickle.loads(inp.read(struct.unpack("<Q", head)[0]))
    try:
        modname, path, qualname, (ordered, ce, attrs), opts = req
        obj = load(modname, path)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        ck = sm90._compile(obj, ordered, ce, attrs, opts)
        asm = {k: v for k, v in ck.asm.items() if isinstance(v, (bytes, str))}
        meta = {k: getattr(ck.metadata, k) for k in ("shared", "num_warps", "num_ctas", "num_stages", "name",
                                                      "launch_cooperative_grid") if hasattr(ck.metadata, k)}
        reply = ("ok", asm, meta)
    except BaseException as e:
        reply = ("error", f"{type(e).__name__}: {e}", traceback.format_exc())
    data = pickle.dumps(reply)
    out.write(struct.pack("<Q", len(data)) + data)
    out.flush()
"""


class _Helper:
    def __init__(self) -> None:
        env = dict(os.environ)
        env["TRITON_INTERPRET"] = "0"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HELPER_MAIN, os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def compile(self, fn, request, opts):
        import inspect

        path = inspect.getsourcefile(fn)
        msg = pickle.dumps((fn.__module__, path, fn.__qualname__, request, opts))
        with self.lock:
            self.proc.stdin.write(struct.pack("<Q", len(msg)) + msg)
            self.proc.stdin.flush()
            head = self.proc.stdout.read(8)
            if len(head) < 8:
                raise Sm90CompileError(f"the sm_90 build helper exited (code {self.proc.poll()})")
            reply = pickle.loads(self.proc.stdout.read(struct.unpack("<Q", head)[0]))
        if reply[0] != "ok":
            raise Sm90CompileError(f"sm_90 build of {fn.__qualname__} failed: {reply[1]}\n{reply[2]}")
        return Sm90Build(asm=reply[1], metadata=types.SimpleNamespace(**reply[2]))


_HELPER: _Helper | None = None


def _helper() -> _Helper:
    global _HELPER
    if _HELPER is None or not _HELPER.alive():
        _HELPER = _Helper()
    return _HELPER
