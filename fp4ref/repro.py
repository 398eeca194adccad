"""``fp4ref verify --repro DIR``: shrink a failing case and write a self-contained reproducer.

Shrinking (each step keeps a candidate only if the kernel's output still fails fp4ref's check on it, a kernel that
raises on it does not count): the smallest M of 1, 2, 4, ... below the failing one; then the smallest (N, K) of
:func:`fp4ref.verify.sweep_shapes` below the failing ones; then the fewest non-zero K-blocks of the A-side
operand (blocks of 64 columns of A, 16 groups of the 2:4 operand, 4 NVFP4 blocks of x), halving the non-zero ones
while the failure stays.

Written: ``DIR/inputs.npz`` (the operands; bfloat16 and float8 arrays as their raw bits beside a dtype name) and
``DIR/repro.py``, which loads them, calls the kernel, checks the output with :func:`fp4ref.bounds.check` under the
same model and rules, prints the report and exits 1 while the bug is there (0 once it is fixed). This module
imports torch only inside the functions that run the kernel (fp4ref.verify's rule).
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace

import ml_dtypes
import numpy as np

from ._validate import current_umask

__all__ = ["write_repro", "save_operands", "load_operands"]

_RAW = {"bfloat16": (ml_dtypes.bfloat16, np.uint16), "float8_e4m3fn": (ml_dtypes.float8_e4m3fn, np.uint8)}


def save_operands(path: str, ops: dict) -> None:
    """Save a workload's operand dict to ``path`` (.npz) without pickles (see the module docstring)."""
    arrays, kinds = {}, {}
    for name, v in ops.items():
        if isinstance(v, (float, int, np.floating, np.integer)):
            arrays[name], kinds[name] = np.array(float(v)), "float"
        elif np.asarray(v).dtype.name in _RAW:
            a = np.asarray(v)
            arrays[name], kinds[name] = a.view(_RAW[a.dtype.name][1]), a.dtype.name
        else:
            arrays[name], kinds[name] = np.asarray(v), "array"
    arrays["__kinds__"] = np.array(json.dumps(kinds))
    np.savez(path, **arrays)


def load_operands(path: str) -> dict:
    """Read what :func:`save_operands` wrote."""
    with np.load(path, allow_pickle=False) as data:
        kinds = json.loads(str(data["__kinds__"]))
        ops = {}
        for name, kind in kinds.items():
            a = data[name]
            if kind == "float":
                ops[name] = float(a)
            elif kind in _RAW:
                ops[name] = a.view(_RAW[kind][0])
            else:
                ops[name] = a
    return ops


def _fails(case, ops, device) -> bool:
    """The kernel's output on ``ops`` fails fp4ref's check (a raise or a rejected output does not count)."""
    from .verify import _check_one, _poisoned_call, _read_output, _to_torch

    w = case.w
    ref = w.reference(**ops)
    out_t, exc = _poisoned_call(case, [_to_torch(ops[a], device) for a in w.args], device)
    if exc is not None:
        return False
    try:
        out = _read_output(case, out_t)
        report = _check_one(out, ref, None, case.n, case.model, case.rounding,
                            exact_accumulation=case.family in w.exact_families)[0]
    except (ValueError, TypeError):
        return False
    return not report.ok


def _ops_for(case, seed):
    from .verify import _example

    return _example(case, seed, 0, None)[0]


def _zero_blocks(case, ops, keep: np.ndarray) -> dict:
    """``ops`` with the A-side operand's K-blocks outside ``keep`` (bool per block) set to zero."""
    name = case.w.name
    out = dict(ops)
    if name.startswith("gemm"):
        a = ops["A"].copy()
        cols = np.repeat(keep, 64)[: a.shape[1]]
        a[:, ~cols] = 0
        out["A"] = a
    elif name.startswith("sparse"):
        v = ops["a_vals"].copy()
        cols = np.repeat(keep, 16)[: v.shape[1]]
        v[:, ~cols] = 0
        out["a_vals"] = v
    else:
        x = ops["x"].astype(np.float32)
        cols = np.repeat(keep, 64)[: x.shape[-1]]
        x[..., ~cols] = 0
        out["x"] = x.astype(ml_dtypes.bfloat16)
    return out


def _n_blocks(case) -> int:
    per = 16 * 4 if case.w.name.startswith("sparse") else 64
    return -(-case.k // per)


def shrink(case, seed: int, device: str):
    """The smallest failing (case, operands) found from ``case`` (see the module docstring)."""
    from .verify import sweep_shapes

    best = (case, _ops_for(case, seed))
    m = 1
    while m < case.m:  # smallest M first
        c = replace(case, m=m, integrity=False)
        ops = _ops_for(c, seed)
        if _fails(c, ops, device):
            best = (c, ops)
            break
        m *= 2
    c0 = best[0]
    for n, k in sorted(sweep_shapes(case.w), key=lambda nk: nk[0] * nk[1]):
        if n * k >= c0.n * c0.k or n > c0.n or k > c0.k:
            continue
        c = replace(c0, n=n, k=k)
        ops = _ops_for(c, seed)
        if _fails(c, ops, device):
            best = (c, ops)
            break
    c, ops = best
    keep = np.ones(_n_blocks(c), bool)
    for _ in range(12):  # halve the non-zero blocks while the failure stays
        idx = np.flatnonzero(keep)
        if idx.size <= 1:
            break
        for half in (idx[idx.size // 2:], idx[: idx.size // 2]):
            trial = keep.copy()
            trial[half] = False
            cand = _zero_blocks(c, ops, trial)
            if _fails(c, cand, device):
                keep = trial
                break
        else:
            break
    return c, _zero_blocks(c, ops, keep), int(keep.sum()), keep.size


_SCRIPT = '''"""Reproducer written by `fp4ref verify --repro`: {what}.

Run from the directory the kernel imports from: python {script}
Exit status 1 while the kernel's output fails fp4ref's check on these inputs, 0 once it passes.
"""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "{interpret}")  # before any @triton.jit module is imported
sys.path.insert(0, os.getcwd())

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from fp4ref import bounds  # noqa: E402
from fp4ref.repro import load_operands  # noqa: E402
from fp4ref.verify import load_kernel  # noqa: E402
from fp4ref.workloads import get_workload  # noqa: E402

KERNEL = {kernel!r}
WORKLOAD = {workload!r}
DEVICE = {device!r}
MODEL = {model!r}
ROUNDING = {rounding!r}
EXACT_ACCUMULATION = {exact!r}


def to_torch(a):
    if isinstance(a, float):
        return a
    a = np.ascontiguousarray(a)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).to(DEVICE)
    if a.dtype == ml_dtypes.float8_e4m3fn:
        return torch.from_numpy(a.view(np.uint8).copy()).view(torch.float8_e4m3fn).to(DEVICE)
    return torch.from_numpy(a.copy()).to(DEVICE)


ops = load_operands(os.path.join(os.path.dirname(os.path.abspath(__file__)), "inputs.npz"))
w = get_workload(WORKLOAD)
ref = w.reference(**ops)  # fp4ref's exact reference, correctly rounded
fn, _ = load_kernel(KERNEL)
args = [to_torch(ops[a]) for a in w.args]
dtype = {{"float16": torch.float16, "bfloat16": torch.bfloat16}}[w.output_dtype]
poison = torch.full(ref.out.shape, float("nan"), dtype=dtype, device=DEVICE)  # the allocator hands this NaN
del poison  # block to the kernel's output: an element it never writes stays NaN
out = fn(*args)
report = bounds.check(out, ref, MODEL, output_rounding=ROUNDING, poison=float("nan"),
                      exact_accumulation=EXACT_ACCUMULATION)
print(report.message() if not report.ok else report.summary())
sys.exit(0 if report.ok else 1)
'''


def write_repro(directory: str, case, ops: dict, *, seed: int, device: str) -> str:
    """Shrink ``case`` (whose example ``ops`` failed) and write DIR/inputs.npz and DIR/repro.py; return a line
    saying what was written. Both files are written under temporary names and then renamed: an interrupt or an
    error leaves either both or neither (and removes DIR again if this call created it)."""
    c, small, nz, nb = shrink(case, seed, device)
    if not _fails(c, small, device):  # nothing smaller fails: keep the original operands
        c, small, nz, nb = case, ops, _n_blocks(case), _n_blocks(case)
    what = (f"{c.w.name}, family {c.family}, M={c.m} N={c.n} K={c.k}, {nz} of {nb} K-blocks non-zero, "
            f"kernel {c.spec}")
    script = _SCRIPT.format(what=what, script=os.path.join(directory, "repro.py"),
                            interpret="1" if device == "cpu" else "0", kernel=c.spec, workload=c.w.name,
                            device=device, model=c.model, rounding=c.rounding, exact=c.family in c.w.exact_families)
    created = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    temps, placed = [], []
    try:
        fd, tmp_npz = tempfile.mkstemp(dir=directory, prefix=".inputs-", suffix=".npz")
        os.close(fd)
        temps.append(tmp_npz)
        save_operands(tmp_npz, small)
        fd, tmp_py = tempfile.mkstemp(dir=directory, prefix=".repro-", suffix=".py")
        temps.append(tmp_py)
        with os.fdopen(fd, "w") as fh:
            fh.write(script)
        for tmp, name in ((tmp_npz, "inputs.npz"), (tmp_py, "repro.py")):
            os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600: what open() would make instead
            os.replace(tmp, os.path.join(directory, name))
            placed.append(name)
    except BaseException:
        for tmp in temps:
            if os.path.lexists(tmp):
                os.remove(tmp)
        if len(placed) == 1:  # inputs.npz without its repro.py
            os.remove(os.path.join(directory, placed[0]))
        if created and not os.listdir(directory):
            os.rmdir(directory)
        raise
    return f"wrote {os.path.join(directory, 'repro.py')} and inputs.npz ({what})"
