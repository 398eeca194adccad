"""``fp4ref verify``: run kernels on the workloads' inputs and check them against the exact references.

For each workload (:mod:`fp4ref.workloads`), size M and input family, the operands are generated in numpy from a
seed, moved to torch, given to the kernel, and the output is checked with :func:`fp4ref.bounds.check` against the
exact reference under the kernel's declared accumulation model; the public benchmarks' own checkers
(FlashInfer-Bench ``atol = rtol = 1e-2``; SOL-ExecBench ``|o - r| <= 0.005 + 0.02 |r|`` for 99%) are applied to the
same outputs, for the record.

On a CUDA GPU the workloads run at the public benchmarks' sizes; without one, in the Triton CPU interpreter at
small M with the full N and K. Unwritten outputs: before each call a tensor of the output's size filled with a NaN
of its own payload (:data:`POISON_BITS`) is allocated and released, so the allocator hands the same (poisoned)
block to the kernel's ``torch.empty``; an element the kernel never writes then still holds those bits and counts
as unwritten, while a NaN the kernel computes (other bits) counts as a NaN mismatch (best effort: a kernel that
allocates differently escapes this, as on the CPU, whose allocator does not cache blocks; the project's own tests
also pass NaN-filled output buffers directly).

This module is the one place in fp4ref that imports torch (lazily, inside functions; importing it does not).
"""
from __future__ import annotations

import importlib
import json
import math
import os
import time
import warnings
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from .workloads import WORKLOADS, Workload, get_workload

#: The output poison's bits per output dtype: quiet NaNs with a payload (0x5A) that arithmetic does not produce
#: (NVIDIA GPUs write the canonical 0x7FFF, numpy 0x7E00 / 0x7FC0), so an unwritten element is told from a NaN the
#: kernel computed (:func:`fp4ref.bounds.check`'s ``poison``).
POISON_BITS = {"float16": 0x7E5A, "bfloat16": 0x7FDA}

__all__ = ["Row", "VerifyResult", "load_kernel", "kernel_contract", "verify", "workload_from_definition", "max_m",
           "check_sizes", "Interrupted", "MissingDependency"]


@dataclass
class Row:
    """One line of the verification table: a (workload, M, family) cell over ``examples`` seeds."""

    workload: str
    m: int
    family: str
    model: str = ""  # the accumulation model the row is checked under
    output_rounding: str = ""  # the output rounding it is checked under ("rne" or "faithful")
    examples: int = 0
    checked_rows: int = 0
    # Worst over the completed examples; NaN while none completed (a kernel that raised has no metrics).
    max_err_over_bound: float = math.nan
    max_ulps: float = math.nan
    bitwise_equal_pct: float = math.nan
    sqnr_db: float = math.nan
    fib_ok: bool = True
    sol_ok: bool = True
    fp4ref_ok: bool = True
    seconds: float = 0.0
    note: str = ""
    n: int = 0
    k: int = 0
    kind: str = "numeric"  # or "integrity" (family "integrity:<check>"; FIB/SOL repeat the verdict)
    diagnosis: list = field(default_factory=list)  # fp4ref.diagnose bug names when the check failed
    # An integrity check that could not run (the first call gave no output to check): its verdict is "not run",
    # not FAIL; fp4ref_ok stays False, as nothing was verified.
    not_run: bool = False

    @property
    def verdict(self) -> str:
        """fp4ref's verdict as shown: "pass", "not run" or "FAIL"."""
        return "pass" if self.fp4ref_ok else "not run" if self.not_run else "FAIL"


@dataclass
class VerifyResult:
    """All rows plus the settings they were produced with. ``ok`` is True iff every fp4ref verdict passed."""

    rows: list = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    missing: list = field(default_factory=list)  # (workload, reason) for kernels that could not be loaded
    skipped: list = field(default_factory=list)  # (workload, reason) for workloads with none of the families asked

    @property
    def ok(self) -> bool:
        return not self.missing and bool(self.rows) and all(r.fp4ref_ok for r in self.rows)

    def to_json(self) -> dict:
        """The report as strict-JSON data (non-finite floats as the strings "inf", "-inf", "nan"; an integrity
        row's metrics, public checkers' verdicts, model and output rounding, which do not apply to it, as null)."""
        return _json_safe({"ok": self.ok, "settings": self.settings, "missing": self.missing,
                           "skipped": self.skipped, "rows": [_row_json(r) for r in self.rows]})


#: Row fields that only a numeric row has: null in an integrity row's JSON (its table cells show "-").
_NUMERIC_ONLY = ("model", "output_rounding", "checked_rows", "max_err_over_bound", "max_ulps", "bitwise_equal_pct",
                 "sqnr_db", "fib_ok", "sol_ok")


def _row_json(row: Row) -> dict:
    d = asdict(row)
    if row.kind == "integrity":
        d.update(dict.fromkeys(_NUMERIC_ONLY))
    return d


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`verify`: a KeyboardInterrupt that carries the :class:`VerifyResult` so far as
    ``result`` (its rows, and ``settings["repro"]`` when a reproducer was written before the interrupt)."""

    def __init__(self, result: VerifyResult):
        super().__init__("interrupted")
        self.result = result


class MissingDependency(ModuleNotFoundError):
    """A module :func:`verify` needs is not installed (torch: the kernels run on torch tensors; triton: the
    project's kernels; hypothesis: the exact-accumulation inputs). The message names it, says why it is needed and
    how to install it (:data:`INSTALL`); ``name`` is the first missing module. ``fp4ref verify`` prints the message
    as one line and exits 2, before any kernel runs."""


#: The command that installs what :func:`verify` needs (pyproject's ``kernels`` extra: torch, triton, hypothesis).
INSTALL = "pip install 'fp4ref[kernels]'"


def _installed(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it (triton must not be imported before TRITON_INTERPRET
    is set). A module set to None in sys.modules counts as not installed, as the import system treats it."""
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _hypothesis_families(workloads, families) -> list:
    """The families a run of these workloads and families builds with fp4ref.strategies' arrays, which need
    hypothesis (``Workload.hypothesis_families``)."""
    out = []
    for name in workloads:
        w = get_workload(name)
        out += [f for f in (families or w.families) if f in w.hypothesis_families and f not in out]
    return out


def check_dependencies(workloads=None, *, kernel: str | None = None, families=None) -> None:
    """Raise :class:`MissingDependency` if a module the run needs is not installed: torch always (the operands go to
    the kernel as torch tensors), triton for the project's kernels (no ``kernel``), hypothesis when the run builds a
    family with fp4ref.strategies (``Workload.hypothesis_families``). Unknown workload names are left to
    :func:`verify`'s own checks."""
    missing = [m for m in (("torch", "triton") if kernel is None else ("torch",)) if not _installed(m)]
    why = []
    if missing:
        why.append("runs the kernels, which need torch and triton" if kernel is None
                   else "passes the operands to the kernel as torch tensors, so it needs torch")
    built = _hypothesis_families([n for n in dict.fromkeys(workloads or WORKLOADS) if n in WORKLOADS], families)
    alternative = ""
    if built and not _installed("hypothesis"):
        missing.append("hypothesis")
        why.append(f"builds the {' and '.join(built)} inputs with hypothesis")
        if missing == ["hypothesis"]:  # the run needs nothing else
            alternative = f" (or leave {' and '.join(built)} out of --families)"
    if missing:
        raise MissingDependency(f"verify {', and '.join(why)}; not installed: {', '.join(missing)}. Install with: "
                                f"{INSTALL}{alternative}", name=missing[0])


def load_kernel(spec: str):
    """Import ``"package.module:function"`` and return (function, module).

    Raises:
        ValueError: ``spec`` is not of the form module:function. ImportError / AttributeError from the import.
    """
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"kernel (--kernel)={spec!r} must look like 'package.module:function'")
    mod_name, fn_name = spec.split(":")
    module = importlib.import_module(mod_name)
    fn = getattr(module, fn_name)
    if not callable(fn):
        raise TypeError(f"kernel (--kernel)={spec!r} is not callable")
    return fn, module


def kernel_contract(module, output: str = "float16"):
    """The kernel module's declared numerics as a :class:`fp4ref.bounds.NumericContract`, or None (none declared).

    ``NUMERIC_CONTRACT``: a NumericContract, or a plain dict (the short form for user kernels) read by
    :meth:`NumericContract.from_dict`; else ``NUMERIC_MODEL = "<name>"`` (the shortest form: the accumulation
    model alone, the other terms at their defaults). ``output`` is the workload's output dtype name, used for the
    short forms.

    Raises:
        TypeError: ``NUMERIC_CONTRACT`` or ``NUMERIC_MODEL`` of another type. ValueError: a model name
            :func:`fp4ref.bounds.get_model` does not know; a dict key :meth:`NumericContract.from_dict` does not
            know (the message names the module, the key and the known keys).
    """
    from .bounds import NumericContract, get_model

    name = getattr(module, "__name__", "the kernel module")
    contract = getattr(module, "NUMERIC_CONTRACT", None)
    if isinstance(contract, NumericContract):
        return contract
    if isinstance(contract, dict):
        try:
            return NumericContract.from_dict(contract, output=output)
        except (TypeError, ValueError) as exc:  # name the declaration (an unknown key, model, rounding, ...)
            raise type(exc)(f"{name}.NUMERIC_CONTRACT: {str(exc).removeprefix('contract: ')}") from None
    if contract is not None:
        raise TypeError(f"{name}.NUMERIC_CONTRACT: expected a NumericContract or a dict, got {type(contract).__name__}")
    model = getattr(module, "NUMERIC_MODEL", None)
    if model is None:
        return None
    if not isinstance(model, str):
        raise TypeError(f"{name}.NUMERIC_MODEL={model!r}: expected a model name (str), got {type(model).__name__}")
    get_model(model)  # an unknown name is a ValueError that lists the models
    return NumericContract.from_dict({"accumulation_model": model}, output=output)


# ----------------------------------------------------------------------------------------------- torch bridge


def _to_torch(value, device):
    import ml_dtypes
    import torch

    if isinstance(value, (float, int)):
        return value
    a = np.array(value, copy=True, order="C")  # the kernel gets its own copy: it cannot change the reference's inputs
    if a.dtype == ml_dtypes.bfloat16:
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    elif a.dtype == ml_dtypes.float8_e4m3fn:
        t = torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    else:
        t = torch.from_numpy(a)
    return t.to(device)


def _dtype_of(name: str):
    import ml_dtypes

    return {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[name]


def _poison_allocator(shape, dtype_name: str, device) -> None:
    """Leave a block of the output's size holding the poison NaN (:data:`POISON_BITS`) in the caching allocator
    (see the module docstring)."""
    import torch

    dt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype_name]
    buf = torch.full(shape, POISON_BITS[dtype_name], dtype=torch.int16, device=device).view(dt)
    del buf


def poison_value(dtype_name: str):
    """The poison as a scalar of the output dtype (``check``'s ``poison``, compared bit for bit)."""
    return np.array([POISON_BITS[dtype_name]], np.uint16).view(_dtype_of(dtype_name))[0]


# --------------------------------------------------------------------------------------------------- checking


def _row_subset(m: int, limit: int | None, rng) -> np.ndarray | None:
    """Rows to check when M is large (the reference is exact and costs CPU time): first/last 64, 128 random."""
    if limit is None or m <= limit:
        return None
    head = np.arange(min(64, m))
    tail = np.arange(max(0, m - 64), m)
    mid = rng.choice(np.arange(64, max(65, m - 64)), size=max(0, limit - 128), replace=False)
    return np.unique(np.concatenate([head, mid, tail]))


def _check_one(out, ref, rows, n: int, model, output_rounding, exact_accumulation=False):
    from . import bounds, testing

    if rows is not None:
        out = out.reshape(-1, n)[rows]
    out = out.reshape(ref.out.shape)  # same element count: validated by the caller
    report = bounds.check(out, ref, model, output_rounding=output_rounding,
                          poison=poison_value(ref.output_format.name), exact_accumulation=exact_accumulation)
    fib = testing.fib_allclose(out, ref.out)
    sol = testing.sol_allclose(out, ref.out)
    return report, bool(fib), bool(sol), int(np.prod(ref.out.shape[:-1]))  # output rows checked


def _inputs_changed(args, ops, names) -> list:
    """Names of the kernel's tensor arguments whose bytes differ from the operands they were copied from."""
    from ._interop import is_torch_tensor, to_numpy

    changed = []
    for a, name in zip(args, names):
        if is_torch_tensor(a):
            now = np.ascontiguousarray(to_numpy(a, name)).view(np.uint8)
            if not np.array_equal(now, np.ascontiguousarray(ops[name]).view(np.uint8)):
                changed.append(name)
    return changed


#: The integrity verdicts, each a row of the table (family column ``integrity:<name>``), run once per workload
#: at its first size on fresh ``public`` inputs.
INTEGRITY_CHECKS = {
    "inputs_unchanged": "no call changes the bytes of an input tensor (the workloads' no-mutation constraint)",
    "output_not_aliased": "the output shares no memory with an input tensor",
    "fresh_inputs_same_buffers": "new values written into the same input tensors give the new, correct output "
                                 "(no output cache keyed on pointers or input fingerprints)",
    "repeat_bitwise": "a second call on the same inputs returns a bitwise equal output",
    "mid_run_output_kept": "an output taken before further calls still holds its verified values after them",
    "plain_dense_output": "the result is a plain torch.Tensor (no subclass, not lazy or meta; strided) of the "
                          "declared dtype on the inputs' device",
}

#: ``--shapes sweep``: (N, K) around tile boundaries, for a kernel that claims general shapes; q is the
#: workload's K granule (fp16 rows of 16 bytes: 8; 2:4 groups: 4; NVFP4 blocks: 16), r its N granule (8; for
#: NVFP4 16: weight rows in 16-row groups, as the project's kernel requires).
_SWEEP_M = (1, 7, 65)


def sweep_shapes(workload) -> list:
    """(N, K) pairs of ``--shapes sweep``: K and N below one tile, K not a multiple of 64 / 128, N tails."""
    q = {"gemm_n3072_k2048": 8, "sparse_gemm_fp4_fp8_n2048_k2048": 4}.get(workload.name, 16)
    r = 16 if workload.name.startswith("nvfp4") else 8
    return [(r, q), (64 + r, 64 - q), (128 - r, 128 + q), (192 + r, 320 + q)]


#: The most elements one operand or output of a run may hold: the int32 offsets kernels index with reach 2**31 - 1.
MAX_ELEMENTS = 2**31 - 1


def max_m(workload) -> int:
    """The largest M ``verify`` accepts for ``workload`` (a name or :class:`Workload`): M * max(N, K) of its full N
    and K stays within :data:`MAX_ELEMENTS`, so no operand or output of M rows reaches 2**31 elements (699050 for
    gemm_n3072_k2048; the public benchmarks' M are far below)."""
    w = get_workload(workload) if isinstance(workload, str) else workload
    return MAX_ELEMENTS // max(w.n, w.k)


def check_sizes(names, sizes, flag: str = "sizes") -> list:
    """``sizes`` as a list of ints, each M once in the order given (a repeated M would repeat its rows).

    Raises:
        ValueError: naming ``flag`` (``sizes=[...]`` for the function, ``--sizes M`` for the command line), for an
            empty list, an M that is not an int >= 1, or an M above :func:`max_m` of one of the workloads ``names``.
    """
    cli = flag.startswith("--")
    sizes = list(sizes)
    bad = [m for m in sizes if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1]
    if bad or not sizes:
        what = f"{flag} {' '.join(map(str, bad))}" if cli and bad else f"{flag}={sizes!r}"
        raise ValueError(f"{what}: every M must be an int >= 1 (an empty output verifies nothing)")
    for name in names:
        top = max_m(name)
        big = [int(m) for m in sizes if m > top]
        if big:
            what = f"{flag} {big[0]}: above" if cli else f"{flag}={sizes!r}: M={big[0]} is above"
            raise ValueError(f"{what} {top}, the largest M for {name} (M * max(N, K) must stay below 2**31 "
                             "elements, the int32 offsets kernels index with)")
    return list(dict.fromkeys(int(m) for m in sizes))


@dataclass(frozen=True)
class _Case:
    w: Workload
    fn: object
    spec: str
    model: str
    rounding: str
    m: int
    n: int
    k: int
    family: str
    integrity: bool  # run the integrity checks after this case's first example


def verify(
    workloads=None,
    *,
    kernel: str | None = None,
    device: str | None = None,
    sizes=None,
    families=None,
    examples: int = 1,
    seed: int = 0,
    model=None,
    output_rounding: str | None = None,
    max_check_rows: int | None = 256,
    shapes: str = "fixed",
    integrity: bool = True,
    repro: str | None = None,
    progress=None,
) -> VerifyResult:
    """Verify kernels on workloads. See the module docstring; ``fp4ref verify --help`` for the options.

    Args:
        workloads: workload names (default: all three).
        kernel: "module:function" of a user kernel (then exactly one workload); default: the project's kernel.
        device: "cuda" or "cpu" (Triton kernels run in the interpreter: TRITON_INTERPRET=1); default cuda if
            available.
        sizes: M values (default: the public sizes on cuda, small ones on cpu); each at most :func:`max_m` of every
            workload; a repeated M counts once.
        families: input family names (default: all of the workload's); a repeated name counts once. A workload
            that has none of them is not run and is listed in ``VerifyResult.skipped`` (``fp4ref verify`` prints a
            note naming it); a name that none of the workloads has is a ValueError.
        examples: seeds per (workload, M, family).
        model: accumulation model name for fp4ref.bounds (default: the kernel's declared one, else the universal
            fp32-accumulating tensor-core model).
        output_rounding: "rne" or "faithful" (default: the kernel's declared one for the device; rne otherwise).
        max_check_rows: check at most this many rows of a large-M output (None: all).
        shapes: "fixed" (the workload's N and K: the GPU's, or the CPU sizes in the interpreter) or "sweep"
            (:func:`sweep_shapes`, for a kernel that claims general shapes; M from ``sizes`` or 1, 7, 65).
        integrity: run the :data:`INTEGRITY_CHECKS` (one row each per workload).
        repro: a directory: for the first failing row, shrink the case and write a reproducer there
            (:func:`fp4ref.repro.write_repro`).
        progress: a callable(advance: int, description: str) or None; called after each row with a line that
            names the row and its verdict.

    Returns:
        :class:`VerifyResult`.

    Raises:
        ValueError: a bad argument, or a model (``model`` or the kernel's declaration) whose eps_acc(K) is >= 1
            at a workload's K (no useful bound: an all-zero output would pass; before any kernel runs).
            :class:`MissingDependency`: torch, triton (for the project's kernels, or a ``kernel`` that imports it)
            or hypothesis (for the exact-accumulation families) is not installed (before any kernel runs).
            MemoryError: the operands of an M do not fit in memory (the message names the M and the workload).
            :class:`Interrupted`: Ctrl-C during the run.
    """
    names = list(dict.fromkeys(workloads or WORKLOADS))
    if kernel is not None and len(names) != 1:
        raise ValueError(f"kernel (--kernel)={kernel!r} needs exactly one workload, got {names}")
    if device not in (None, "cuda", "cpu"):
        raise ValueError(f"device (--device)={device!r} must be 'cuda' or 'cpu'")
    if output_rounding is not None:
        from .bounds import parse_output_rounding

        output_rounding = parse_output_rounding(output_rounding, "output_rounding (--output-rounding)")
    if shapes not in ("fixed", "sweep"):
        raise ValueError(f"shapes (--shapes)={shapes!r} must be 'fixed' or 'sweep'")
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise ValueError(f"examples (--examples)={examples!r} must be a positive int")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed (--seed)={seed!r} must be a non-negative int")
    for name in names:
        get_workload(name)
    if sizes is not None:
        sizes = check_sizes(names, sizes)
    if families is not None:
        families = list(dict.fromkeys(families))
    if max_check_rows is not None and (not isinstance(max_check_rows, int) or max_check_rows < 129):
        raise ValueError(f"max_check_rows (--max-check-rows)={max_check_rows!r} must be None (all rows) or an int "
                         ">= 129 (the first 64, the last 64 and at least one row between)")
    if repro is not None and (not isinstance(repro, str) or (os.path.exists(repro) and not os.path.isdir(repro))):
        raise ValueError(f"repro (--repro)={repro!r} must be a directory path")
    if families is not None:
        for f in families:
            if not any(f in get_workload(n).families for n in names):
                known = sorted({g for n in names for g in get_workload(n).families})
                raise ValueError(f"family (--families)={f!r} is not a family of {names}; their families are {known}")
    from . import bounds

    if model is not None:
        try:
            bounds.get_model(model)  # unknown names fail now, not after the run
        except ValueError as e:
            raise ValueError(f"model (--model): {e}") from None

    check_dependencies(names, kernel=kernel, families=families)
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device (--device)='cuda' but torch sees no CUDA GPU")
    interpreted = device == "cpu"
    if interpreted and os.environ.get("TRITON_INTERPRET") != "1":
        # Must be set before any @triton.jit module is imported.
        os.environ["TRITON_INTERPRET"] = "1"

    from . import __version__

    # What was asked (None: the defaults; each row names the M, family, model and rounding it was checked with)
    result = VerifyResult(settings={
        "fp4ref": __version__, "device": device if not interpreted else "cpu (TRITON_INTERPRET=1)",
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None, "workloads": names, "kernel": kernel,
        "sizes": sizes, "families": families, "examples": examples, "seed": seed,
        "model": None if model is None else bounds.get_model(model).name,
        "output_rounding": output_rounding, "max_check_rows": max_check_rows, "shapes": shapes,
        "integrity": integrity,
    })
    plan = []
    for name in names:
        w = get_workload(name)
        fams = [f for f in (families or w.families) if f in w.families]
        if not fams:  # none of the families asked is this workload's: say so, never skip silently
            result.skipped.append([name, f"none of the families (--families) {families} is one of its families "
                                         f"{list(w.families)}"])
            continue
        spec = kernel or w.kernel
        try:
            fn, module = load_kernel(spec)
        except Exception as exc:  # the project's kernel may not exist yet: say so, never skip silently
            if isinstance(exc, ModuleNotFoundError) and exc.name in ("torch", "triton"):  # the machine, not the kernel
                raise MissingDependency(f"the kernel {spec} imports {exc.name}; not installed: {exc.name}. Install "
                                        f"with: {INSTALL}", name=exc.name) from None
            result.missing.append([name, f"{spec}: {type(exc).__name__}: {exc}"])
            continue
        contract = kernel_contract(module, w.output_dtype)
        # Default rne; a kernel may declare "faithful" for the interpreter (its bf16 stores truncate).
        rounding = output_rounding or (contract.rounding_for(interpreted) if contract else "rne")
        dims = sweep_shapes(w) if shapes == "sweep" else [w.dims(interpreted)]
        ms = list(sizes or (_SWEEP_M if shapes == "sweep" else (w.cpu_m if interpreted else w.gpu_m)))
        first = True
        for n, k in dims:
            for m in ms:
                # Each M is checked under the model of the path and config that serves it (a GEMV, a split-K or
                # a persistent tile path of one kernel differ); in the interpreter tl.dot is a numpy fp32 product.
                if model is not None:
                    model_name = bounds.get_model(model).name
                elif contract is not None:
                    cfg = contract.config_for(int(m), n, k, interpreted)
                    model_name = contract.model_for(cfg, k, interpreted, M=int(m), N=n).name
                else:
                    model_name = bounds.DEFAULT_MODEL
                if not bounds.get_model(model_name).eps(k) < 1:  # a 100% error bound: an all-zero output passes
                    src = ("model (--model)" if model is not None
                           else f"the model {spec} declares for M={int(m)}, N={n}")
                    raise ValueError(f"{name} at K={k}: {src}: {bounds.no_bound_message(model_name, k)}")
                for f in fams:
                    plan.append(_Case(w, fn, spec, model_name, rounding, int(m), n, k, f,
                                      integrity and first and f == fams[0]))
                    first = False

    try:
        for case in plan:
            try:
                rows = _run_case(case, device, examples, seed, max_check_rows, repro, result)
            except MemoryError as exc:  # numpy's operands or reference (a kernel's MemoryError is a failing row)
                raise MemoryError(f"M={case.m} of {case.w.name} (N={case.n}, K={case.k}, family {case.family}) "
                                  f"does not fit in memory ({exc})") from None
            for row in rows:
                result.rows.append(row)
                if progress is not None:
                    progress(1, f"{row.workload} M={row.m} N={row.n} K={row.k} {row.family}: {row.verdict} "
                                f"({row.seconds:.1f} s)")
    except KeyboardInterrupt as exc:
        if isinstance(exc, Interrupted):
            raise
        raise Interrupted(result) from None
    return result


def _poisoned_call(case, args, device):
    """Call the kernel with the allocator poisoned; the output (a torch object) or the exception it raised."""
    import torch

    w = case.w
    _poison_allocator(w.output_shape(case.m, case.n), w.output_dtype, device)
    try:
        with warnings.catch_warnings():
            if device == "cpu":  # the interpreter's numpy casts warn on inf/NaN lanes that kernels mask off
                warnings.simplefilter("ignore", RuntimeWarning)
            out = case.fn(*args)
        if device == "cuda":
            torch.cuda.synchronize()
        return out, None
    except (Exception, SystemExit) as exc:  # a user kernel must not end the run, nor pass by exiting
        return None, exc


def _read_output(case, out_t):
    """The output as numpy, validated against the workload's shape and dtype (ValueError says why not)."""
    import torch

    from ._interop import to_numpy

    if isinstance(out_t, torch.Tensor) and type(out_t) is not torch.Tensor:
        out_t = out_t.as_subclass(torch.Tensor)  # read a subclass's values (plain_dense_output judges its type)
    try:
        out = to_numpy(out_t, "output")  # e.g. a meta tensor cannot be copied out: a failing row
    except Exception as exc:
        raise ValueError(f"the kernel's output cannot be read ({type(exc).__name__}: {exc})") from None
    shape = case.w.output_shape(case.m, case.n)
    if getattr(out, "shape", None) != shape or getattr(out, "dtype", None) != np.dtype(
            _dtype_of(case.w.output_dtype)):
        got = f"{out.dtype} {out.shape}" if hasattr(out, "dtype") and hasattr(out, "shape") else type(out).__name__
        raise ValueError(f"the kernel returned {got}; the workload's output is {case.w.output_dtype} {shape}")
    return out


def _example(case, seed, ex, max_check_rows):
    """Operands, checked row subset and reference of one example."""
    w = case.w
    rng = np.random.default_rng([seed, ex, case.m, sum(map(ord, w.name + case.family))])
    ops = w.families[case.family](rng, case.m, case.n, case.k)
    rows = _row_subset(case.m, max_check_rows, rng) if w.slice_rows else None
    # The reference first, from the operands themselves; the kernel then gets copies of them.
    ref = w.reference(**(ops if rows is None else w.slice_rows(ops, rows)))
    return ops, rows, ref


def _run_case(case, device, examples, seed, max_check_rows, repro, result) -> list:
    w = case.w
    row = Row(workload=w.name, m=case.m, family=case.family, model=case.model, output_rounding=case.rounding,
              n=case.n, k=case.k)
    extra = []
    t0 = time.perf_counter()
    exact = case.family in w.exact_families
    for ex in range(examples):
        ops, rows, ref = _example(case, seed, ex, max_check_rows)
        args = [_to_torch(ops[a], device) for a in w.args]
        out_t, exc = _poisoned_call(case, args, device)
        if exc is not None:
            row.fp4ref_ok = row.fib_ok = row.sol_ok = False
            row.note = f"kernel raised {type(exc).__name__}: {exc}"
            break
        try:
            out = _read_output(case, out_t)
            changed = _inputs_changed(args, ops, w.args)
            if case.integrity and ex == 0:  # before the row's verdict: a failing call still gets its integrity rows
                extra = _integrity(case, device, seed, max_check_rows, args, ops, out_t, out, changed)
            if changed:
                raise ValueError(f"the kernel modified its input(s) {changed}")
            report, fib, sol, nrows = _check_one(out, ref, rows, case.n, case.model, case.rounding,
                                                exact_accumulation=exact)
        except (ValueError, TypeError) as exc:
            row.fp4ref_ok = row.fib_ok = row.sol_ok = False
            row.note = f"output rejected: {exc}"
            break
        row.examples += 1
        row.checked_rows = nrows
        first = row.examples == 1
        row.max_err_over_bound = _worse(row.max_err_over_bound, float(report.max_err_over_bound), max, first)
        if report.finite_pairs:  # (no finite element: no ulp distance; the row keeps "-" unless another has one)
            row.max_ulps = _worse(row.max_ulps, float(report.max_ulps), max, first or row.max_ulps != row.max_ulps)
        row.bitwise_equal_pct = _worse(row.bitwise_equal_pct, 100.0 * float(report.bitwise_equal_fraction), min,
                                       first)
        row.sqnr_db = _worse(row.sqnr_db, float(report.sqnr_db), min, first)
        row.fib_ok &= fib
        row.sol_ok &= sol
        row.fp4ref_ok &= bool(report.ok)
        if not report.ok and not row.note:
            row.note = report.summary()
            checked = out if rows is None else out.reshape(-1, case.n)[rows].reshape(ref.out.shape)
            try:
                from .diagnose import diagnose

                found = diagnose(checked, ref, workload=w, operands=ops, rows=rows, output_rounding=case.rounding,
                                 poison=poison_value(ref.output_format.name))
            except Exception as dexc:  # a diagnosis must never hide the verdict
                found = []
                row.note += f" | no diagnosis ({type(dexc).__name__}: {dexc})"
            row.diagnosis = [d.bug for d in found]
            if found:
                row.note += " | likely bug: " + "; ".join(str(d) for d in found)
            if repro is not None and not result.settings.get("repro"):
                from .repro import write_repro

                try:
                    result.settings["repro"] = write_repro(repro, case, ops, seed=seed, device=device)
                except Exception as rexc:  # the verdict stands; say why no reproducer was written
                    result.settings["repro"] = f"not written ({type(rexc).__name__}: {rexc})"
    row.seconds = time.perf_counter() - t0
    if case.integrity and not extra:  # the first example never reached the checks: they cannot pass
        extra = [Row(workload=w.name, m=case.m, family=f"integrity:{c}", model=case.model, n=case.n, k=case.k,
                     fp4ref_ok=False, fib_ok=False, sol_ok=False, kind="integrity", not_run=True,
                     note=f"not run: the first call failed ({row.note})") for c in INTEGRITY_CHECKS]
    return [row] + extra


def _same_memory(a, b) -> bool:
    try:
        sa, sb = a.untyped_storage(), b.untyped_storage()
        a0, b0 = sa.data_ptr(), sb.data_ptr()
        return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes() and sa.nbytes() > 0 and sb.nbytes() > 0
    except Exception:  # e.g. a meta tensor has no storage to share
        return False


def _integrity(case, device, seed, max_check_rows, args, ops, out_t, out, changed) -> list:
    """The INTEGRITY_CHECKS after the first call (``out_t``, read as ``out``) on ``args`` (copies of ``ops``;
    ``changed``: the inputs that call modified)."""
    import torch

    from ._interop import is_torch_tensor, to_numpy

    w = case.w
    verdict, why = {}, {}

    def fail(check, reason):
        if verdict.get(check, True):
            verdict[check], why[check] = False, reason

    for c in INTEGRITY_CHECKS:
        verdict[c] = True
    if changed:
        fail("inputs_unchanged", f"the kernel modified its input(s) {changed}")
    tensors = [(n, a) for n, a in zip(w.args, args) if is_torch_tensor(a)]
    ok_type = type(out_t) is torch.Tensor and out_t.layout == torch.strided and not out_t.is_meta
    if not ok_type:
        fail("plain_dense_output", f"the result is a {type(out_t).__module__}.{type(out_t).__qualname__}"
                                   + (f" ({out_t.layout}{', meta' if out_t.is_meta else ''})"
                                      if isinstance(out_t, torch.Tensor) else ""))
    elif out_t.dtype != {"float16": torch.float16, "bfloat16": torch.bfloat16}[w.output_dtype]:
        fail("plain_dense_output", f"the result is {out_t.dtype}, the workload declares {w.output_dtype}")
    elif tensors and out_t.device != tensors[0][1].device:
        fail("plain_dense_output", f"the result is on {out_t.device}, the inputs on {tensors[0][1].device}")
    aliased = [n for n, a in tensors if isinstance(out_t, torch.Tensor) and _same_memory(out_t, a)]
    if aliased:
        fail("output_not_aliased", f"the output shares memory with input(s) {aliased}")
    before = np.ascontiguousarray(out).view(np.uint8).copy()

    # a second call on the same tensors: bitwise the same output
    again_t, exc = _poisoned_call(case, args, device)
    if exc is not None:
        fail("repeat_bitwise", f"the second call raised {type(exc).__name__}: {exc}")
    else:
        try:
            again = _read_output(case, again_t)
            if not np.array_equal(np.ascontiguousarray(again).view(np.uint8), before):
                n_diff = int(np.sum(again.astype(np.float64) != out.astype(np.float64)))
                fail("repeat_bitwise", f"{n_diff} of {out.size} elements differ between two calls on the same "
                                       "inputs")
        except ValueError as e:
            fail("repeat_bitwise", str(e))
    changed = _inputs_changed(args, ops, w.args)
    if changed:
        fail("inputs_unchanged", f"the kernel modified its input(s) {changed} (second call)")

    # fresh values written into the same tensors: the new, correct output
    rng_seed = seed + 7919  # another example of the same family and size
    fresh_case = replace(case, family="public")
    ops2, rows2, ref2 = _example(fresh_case, rng_seed, 0, max_check_rows)
    same = []
    for name, a in zip(w.args, args):
        if is_torch_tensor(a):
            a.copy_(_to_torch(ops2[name], device))
            same.append(a)
        else:
            same.append(ops2[name])
    fresh_t, exc = _poisoned_call(case, same, device)
    if exc is not None:
        fail("fresh_inputs_same_buffers", f"the call on the rewritten inputs raised {type(exc).__name__}: {exc}")
    else:
        try:
            fresh = _read_output(case, fresh_t)
            report, _, _, _ = _check_one(fresh, ref2, rows2, case.n, case.model, case.rounding, False)
            if not report.ok:
                stale = np.array_equal(np.ascontiguousarray(fresh).view(np.uint8), before)
                fail("fresh_inputs_same_buffers", ("the output did not change with the fresh inputs (an output "
                                                   "cache, or an output that ignores its inputs)"
                                                   if stale else "wrong output") + f": {report.summary()}")
        except ValueError as e:
            fail("fresh_inputs_same_buffers", str(e))
    changed = _inputs_changed(same, ops2, w.args)
    if changed:
        fail("inputs_unchanged", f"the kernel modified its input(s) {changed} (rewritten inputs)")

    # the first output, taken before those calls, still holds what was verified
    try:
        now = np.ascontiguousarray(to_numpy(out_t, "output")).view(np.uint8)
        if not np.array_equal(now, before):
            n_diff = int(np.sum(now != before))
            fail("mid_run_output_kept", f"the first call's output changed by later calls ({n_diff} bytes): the "
                                        "kernel returns a buffer it reuses")
    except Exception as e:
        fail("mid_run_output_kept", f"the first call's output cannot be read again ({type(e).__name__}: {e})")

    return [Row(workload=w.name, m=case.m, family=f"integrity:{c}", model=case.model, n=case.n, k=case.k,
                fp4ref_ok=verdict[c], fib_ok=verdict[c], sol_ok=verdict[c], kind="integrity",
                note=why.get(c, ""), examples=1) for c in INTEGRITY_CHECKS]


def _worse(old: float, new: float, pick, first: bool) -> float:
    return new if first else pick(old, new)


def _json_safe(x):
    """Strict JSON: non-finite floats become the strings "inf", "-inf", "nan"."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def plan_size(workloads=None, *, device="cpu", sizes=None, families=None, shapes="fixed", integrity=True) -> int:
    """Number of table rows ``verify`` will produce (for a progress bar). A workload none of whose families is
    asked for is skipped, integrity rows too; one whose kernel cannot be loaded is counted (verify then lists it as
    missing, and the bar ends early)."""
    n = 0
    sizes = list(dict.fromkeys(sizes)) if sizes else sizes
    families = list(dict.fromkeys(families)) if families else families
    for name in dict.fromkeys(workloads or WORKLOADS):
        w = get_workload(name)
        fams = [f for f in (families or w.families) if f in w.families]
        if not fams:  # verify skips it (VerifyResult.skipped)
            continue
        ms = sizes or (_SWEEP_M if shapes == "sweep" else (w.cpu_m if device == "cpu" else w.gpu_m))
        dims = len(sweep_shapes(w)) if shapes == "sweep" else 1
        n += dims * len(ms) * len(fams)
        n += len(INTEGRITY_CHECKS) if integrity else 0
    return n


_DEFINITION_DTYPES = {  # the dtype names a FlashInfer-Bench definition uses for each workload operand
    "gemm_n3072_k2048": {"A": "float16", "B": "float16"},
    "sparse_gemm_fp4_fp8_n2048_k2048": {"a_vals": "int8", "a_meta": "int8", "b_fp8": "float8_e4m3fn"},
}


def workload_from_definition(path: str) -> tuple:
    """Read a FlashInfer-Bench definition JSON and return (workload name, {axis: value}) it matches.

    The definition's inputs (the same names, and dtypes) and its constant axes N and K must match one of fp4ref's
    FlashInfer-Bench workloads exactly; the var axis (M) values are not in a definition (they are in workload files),
    so sizes still come from ``--sizes`` or the workload's defaults.

    Raises:
        ValueError: unreadable or malformed JSON, or no fp4ref workload with that signature and constants.
    """
    try:
        with open(path) as fh:
            d = json.load(fh)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--definition {path!r}: cannot read a JSON definition ({exc})") from None
    inputs = d.get("inputs") if isinstance(d, dict) else None
    axes = d.get("axes", {}) if isinstance(d, dict) else None
    if not isinstance(inputs, dict) or not isinstance(axes, dict) or not all(
            isinstance(v, dict) for v in list(inputs.values()) + list(axes.values())):
        raise ValueError(f"--definition {path!r}: expected an object with 'inputs' and 'axes' objects "
                         "(FlashInfer-Bench definition schema)")
    consts = {k: v.get("value") for k, v in axes.items() if v.get("type") == "const"}
    dtypes = {k: v.get("dtype") for k, v in inputs.items()}
    for name, want in _DEFINITION_DTYPES.items():
        w = WORKLOADS[name]
        if dtypes == want and consts.get("N") == w.n and consts.get("K") == w.k:
            return name, consts
    raise ValueError(
        f"--definition {path!r} (name {d.get('name')!r}, inputs {dtypes}, constant axes {consts}) matches none of "
        f"fp4ref's FlashInfer-Bench workloads: " + "; ".join(
            f"{n}: inputs {dt}, N={WORKLOADS[n].n}, K={WORKLOADS[n].k}" for n, dt in _DEFINITION_DTYPES.items())
    )
