"""``fp4ref verify``: run kernels on the workloads' inputs and check them against the exact references.

For each workload (:mod:`fp4ref.workloads`), size M and input family, the operands are generated in numpy from a
seed, moved to torch, given to the kernel, and the output is checked with :func:`fp4ref.bounds.check` against the
exact reference under the kernel's declared accumulation model; the public benchmarks' own checkers
(FlashInfer-Bench ``atol = rtol = 1e-2``; SOL-ExecBench ``|o - r| <= 0.005 + 0.02 |r|`` for 99%) are applied to the
same outputs, for the record.

On a CUDA GPU the workloads run at the public benchmarks' sizes; without one, in the Triton CPU interpreter at
small M with the full N and K. Unwritten outputs: before each call a NaN-filled tensor of the output's size is
allocated and released, so the allocator hands the same (poisoned) block to the kernel's ``torch.empty``; an
element the kernel never writes then stays NaN and shows as a NaN mismatch (best effort: a kernel that allocates
differently escapes this, so the project's own tests also pass NaN-filled output buffers directly).

This module is the one place in fp4ref that imports torch (lazily, inside functions; importing it does not).
"""
from __future__ import annotations

import importlib
import json
import math
import os
import time
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np

from .workloads import WORKLOADS, Workload, get_workload

__all__ = ["Row", "VerifyResult", "load_kernel", "kernel_contract", "verify", "workload_from_definition"]


@dataclass
class Row:
    """One line of the verification table: a (workload, M, family) cell over ``examples`` seeds."""

    workload: str
    m: int
    family: str
    model: str = ""  # the accumulation model the row is checked under
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


@dataclass
class VerifyResult:
    """All rows plus the settings they were produced with. ``ok`` is True iff every fp4ref verdict passed."""

    rows: list = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    missing: list = field(default_factory=list)  # (workload, reason) for kernels that could not be loaded

    @property
    def ok(self) -> bool:
        return not self.missing and bool(self.rows) and all(r.fp4ref_ok for r in self.rows)

    def to_json(self) -> dict:
        """The report as strict-JSON data (non-finite floats as the strings "inf", "-inf", "nan")."""
        return _json_safe({"ok": self.ok, "settings": self.settings, "missing": self.missing,
                           "rows": [asdict(r) for r in self.rows]})


def load_kernel(spec: str):
    """Import ``"package.module:function"`` and return (function, module).

    Raises:
        ValueError: ``spec`` is not of the form module:function. ImportError / AttributeError from the import.
    """
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"kernel={spec!r} must look like 'package.module:function'")
    mod_name, fn_name = spec.split(":")
    module = importlib.import_module(mod_name)
    fn = getattr(module, fn_name)
    if not callable(fn):
        raise TypeError(f"kernel={spec!r} is not callable")
    return fn, module


def kernel_contract(module, output: str = "float16"):
    """The kernel module's ``NUMERIC_CONTRACT`` as a :class:`fp4ref.bounds.NumericContract`, or None.

    A plain dict (the short form for user kernels) is read by :meth:`NumericContract.from_dict`; ``output`` is
    the workload's output dtype name, used for that form.
    """
    from .bounds import NumericContract

    contract = getattr(module, "NUMERIC_CONTRACT", None)
    if isinstance(contract, NumericContract):
        return contract
    if isinstance(contract, dict):
        return NumericContract.from_dict(contract, output=output)
    return None


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
    """Leave a NaN-filled block of the output's size in the caching allocator (see the module docstring)."""
    import torch

    dt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype_name]
    buf = torch.full(shape, float("nan"), dtype=dt, device=device)
    del buf


# --------------------------------------------------------------------------------------------------- checking


def _row_subset(m: int, limit: int | None, rng) -> np.ndarray | None:
    """Rows to check when M is large (the reference is exact and costs CPU time): first/last 64, 128 random."""
    if limit is None or m <= limit:
        return None
    head = np.arange(min(64, m))
    tail = np.arange(max(0, m - 64), m)
    mid = rng.choice(np.arange(64, max(65, m - 64)), size=max(0, limit - 128), replace=False)
    return np.unique(np.concatenate([head, mid, tail]))


def _check_one(out, ref, rows, n: int, model, output_rounding, exact_accumulation):
    from . import bounds, testing

    if rows is not None:
        out = out.reshape(-1, n)[rows]
    out = out.reshape(ref.out.shape)  # same element count: validated by the caller
    report = bounds.check(out, ref, model, output_rounding=output_rounding, poison=float("nan"),
                          exact_accumulation=exact_accumulation)
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
    progress=None,
) -> VerifyResult:
    """Verify kernels on workloads. See the module docstring; ``fp4ref verify --help`` for the options.

    Args:
        workloads: workload names (default: all three).
        kernel: "module:function" of a user kernel (then exactly one workload); default: the project's kernel.
        device: "cuda" or "cpu" (Triton interpreter); default cuda if available.
        sizes: M values (default: the public sizes on cuda, small ones on cpu).
        families: input family names (default: all of the workload's).
        examples: seeds per (workload, M, family).
        model: accumulation model name for fp4ref.bounds (default: the kernel's declared one, else the universal
            fp32-accumulating tensor-core model).
        output_rounding: "rne" or "faithful" (default: the kernel's declared one for the device; rne otherwise).
        max_check_rows: check at most this many rows of a large-M output (None: all).
        progress: a callable(advance: int, description: str) or None.

    Returns:
        :class:`VerifyResult`.
    """
    names = list(workloads or WORKLOADS)
    if kernel is not None and len(names) != 1:
        raise ValueError(f"kernel={kernel!r} needs exactly one workload, got {names}")
    if device not in (None, "cuda", "cpu"):
        raise ValueError(f"device={device!r} must be 'cuda' or 'cpu'")
    if output_rounding not in (None, "rne", "faithful"):
        raise ValueError(f"output_rounding={output_rounding!r} must be 'rne' or 'faithful'")
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise ValueError(f"examples={examples!r} must be a positive int")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r} must be a non-negative int")
    if sizes is not None:
        sizes = list(sizes)
        bad = [m for m in sizes if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1]
        if bad or not sizes:
            raise ValueError(f"sizes={sizes!r}: every M must be an int >= 1 (an empty output verifies nothing)")
    if max_check_rows is not None and (not isinstance(max_check_rows, int) or max_check_rows < 129):
        raise ValueError(f"max_check_rows={max_check_rows!r} must be None (all rows) or an int >= 129 "
                         "(the first 64, the last 64 and at least one row between)")
    for name in names:
        get_workload(name)
    if families is not None:
        for f in families:
            if not any(f in get_workload(n).families for n in names):
                known = sorted({g for n in names for g in get_workload(n).families})
                raise ValueError(f"family={f!r} is not a family of {names}; their families are {known}")
    from . import bounds

    if model is not None:
        bounds.get_model(model)  # unknown names fail now, not after the run

    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA GPU")
    interpreted = device == "cpu"
    if interpreted and os.environ.get("TRITON_INTERPRET") != "1":
        # Must be set before any @triton.jit module is imported.
        os.environ["TRITON_INTERPRET"] = "1"

    from ._interop import to_numpy

    result = VerifyResult(settings={
        "device": device if not interpreted else "cpu (Triton interpreter)",
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "examples": examples, "seed": seed, "kernel": kernel, "max_check_rows": max_check_rows,
    })
    plan = []
    for name in names:
        w = get_workload(name)
        spec = kernel or w.kernel
        try:
            fn, module = load_kernel(spec)
        except Exception as exc:  # the project's kernel may not exist yet: say so, never skip silently
            result.missing.append([name, f"{spec}: {type(exc).__name__}: {exc}"])
            continue
        contract = kernel_contract(module, w.output_dtype)
        # Default rne; a kernel may declare "faithful" for the interpreter (its bf16 stores truncate).
        rounding = output_rounding or (contract.rounding_for(interpreted) if contract else "rne")
        fams = [f for f in (families or w.families) if f in w.families]
        ms = list(sizes or (w.cpu_m if interpreted else w.gpu_m))
        for m in ms:
            # Each M is checked under the model of the path and config that serves it (a GEMV, a split-K or a
            # persistent tile path of one kernel differ); in the interpreter tl.dot is a numpy fp32 product.
            if model is not None:
                model_name = bounds.get_model(model).name
            elif contract is not None:
                cfg = contract.config_for(int(m), w.n, w.k, interpreted)
                model_name = contract.model_for(cfg, w.k, interpreted, M=int(m), N=w.n).name
            else:
                model_name = bounds.DEFAULT_MODEL
            for f in fams:
                plan.append((w, fn, model_name, rounding, int(m), f))

    for w, fn, model_name, rounding, m, fam in plan:
        row = Row(workload=w.name, m=m, family=fam, model=model_name)
        t0 = time.perf_counter()
        for ex in range(examples):
            rng = np.random.default_rng([seed, ex, m, sum(map(ord, w.name + fam))])
            ops = w.families[fam](rng, m, w.n, w.k)
            rows = _row_subset(m, max_check_rows, rng) if w.slice_rows else None
            # The reference first, from the operands themselves; the kernel then gets copies of them.
            ref = w.reference(**(ops if rows is None else w.slice_rows(ops, rows)))
            args = [_to_torch(ops[a], device) for a in w.args]
            out_shape = w.output_shape(m)
            _poison_allocator(out_shape, w.output_dtype, device)
            try:
                with warnings.catch_warnings():
                    if interpreted:  # the interpreter's numpy casts warn on inf/NaN lanes that kernels mask off
                        warnings.simplefilter("ignore", RuntimeWarning)
                    out_t = fn(*args)
                if device == "cuda":
                    torch.cuda.synchronize()
            except (Exception, SystemExit) as exc:  # a user kernel must not end the run, nor pass by exiting
                row.fp4ref_ok = row.fib_ok = row.sol_ok = False
                row.note = f"kernel raised {type(exc).__name__}: {exc}"
                break
            try:
                out = to_numpy(out_t, "output")  # e.g. a meta tensor cannot be copied out: a failing row
            except Exception as exc:
                out = exc
            try:
                if isinstance(out, Exception):
                    raise ValueError(f"the kernel's output cannot be read ({type(out).__name__}: {out})")
                changed = _inputs_changed(args, ops, w.args)
                if changed:
                    raise ValueError(f"the kernel modified its input(s) {changed}")
                if getattr(out, "shape", None) != out_shape or getattr(out, "dtype", None) != np.dtype(
                        _dtype_of(w.output_dtype)):
                    raise ValueError(f"the kernel returned {getattr(out, 'dtype', type(out).__name__)} "
                                     f"{getattr(out, 'shape', '')}; the workload's output is {w.output_dtype} "
                                     f"{out_shape}")
                report, fib, sol, nrows = _check_one(out, ref, rows, w.n, model_name, rounding,
                                                    exact_accumulation=fam in w.exact_families)
            except (ValueError, TypeError) as exc:
                row.fp4ref_ok = row.fib_ok = row.sol_ok = False
                row.note = f"output rejected: {exc}"
                break
            row.examples += 1
            row.checked_rows = nrows
            first = row.examples == 1
            row.max_err_over_bound = _worse(row.max_err_over_bound, float(report.max_err_over_bound), max, first)
            row.max_ulps = _worse(row.max_ulps, float(report.max_ulps), max, first)
            row.bitwise_equal_pct = _worse(row.bitwise_equal_pct, 100.0 * float(report.bitwise_equal_fraction), min,
                                           first)
            row.sqnr_db = _worse(row.sqnr_db, float(report.sqnr_db), min, first)
            row.fib_ok &= fib
            row.sol_ok &= sol
            row.fp4ref_ok &= bool(report.ok)
            if not report.ok and not row.note:
                row.note = report.summary()
        row.seconds = time.perf_counter() - t0
        result.rows.append(row)
        if progress is not None:
            progress(1, f"{w.name} M={m} {fam}")
    return result


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


def plan_size(workloads=None, *, device="cpu", sizes=None, families=None) -> int:
    """Number of table rows ``verify`` will produce (for a progress bar)."""
    n = 0
    for name in workloads or WORKLOADS:
        w = get_workload(name)
        ms = sizes or (w.cpu_m if device == "cpu" else w.gpu_m)
        n += len(ms) * len([f for f in (families or w.families) if f in w.families])
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
