"""Argument checks shared by the public functions: clear errors naming the argument, no silent casts."""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import threading

import ml_dtypes
import numpy as np

from ._interop import is_torch_tensor, to_numpy

_FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")


def is_int(v) -> bool:
    """Whether ``v`` is a Python or numpy integer and not a bool (a count, size or index; True is not one)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def is_real(v) -> bool:
    """Whether ``v`` is a Python or numpy real scalar (float or integer) and not a bool."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _ml_dtypes_kind(dt: np.dtype, info) -> bool:
    """Whether ``dt`` is an ml_dtypes dtype that ``info`` (ml_dtypes.finfo or ml_dtypes.iinfo) describes."""
    if dt.kind != "V" or dt.type.__module__ != "ml_dtypes":
        return False
    try:
        info(dt)
    except (TypeError, ValueError):
        return False
    return True


def _real_dtype(dt: np.dtype) -> bool:
    """Whether ``dt`` holds real numbers: numpy's integer and floating dtypes and ml_dtypes' (bfloat16, the float8
    / float6 / float4 formats, int4 / uint4); not bool, complex, object, str, bytes, datetime or void."""
    return dt.kind in "iuf" or _ml_dtypes_kind(dt, ml_dtypes.finfo) or _ml_dtypes_kind(dt, ml_dtypes.iinfo)


def exact_float_dtype(dt: np.dtype) -> bool:
    """numpy's float16 / float32 / float64 and ml_dtypes' floats (bfloat16, the float8 / float6 / float4 formats):
    the dtypes whose every value float64 holds exactly (not longdouble)."""
    return (dt.kind == "f" and dt.itemsize <= 8) or _ml_dtypes_kind(dt, ml_dtypes.finfo)


def _not_scalar(size: int, name: str) -> str:
    """The hint for an array or tensor of ``size`` elements with ndim > 0 given as scalar ``name``."""
    return f" (one element, but not a scalar: pass {name}.item() or index it)" if size == 1 else ""


def real_scalar(v, name: str):
    """``v`` read as a real scalar, for a scalar argument such as ``global_amax``: a Python or numpy int / float as
    it is; a numpy scalar of an ml_dtypes real dtype (``bf16_array.max()``), or the element of a 0-d numpy array or
    0-d torch tensor (``w.abs().max()``) of a real dtype, as the numpy scalar of that dtype holding it bit for bit
    (a torch tensor through :func:`fp4ref._interop.to_numpy`; float8_e8m0fnu as its power of two). The caller
    rounds it as it rounds a Python number: nothing is rounded here.

    Raises:
        TypeError: naming ``name``: a bool (Python, numpy, or a 0-d bool array or tensor), a complex, object, str or
            other non-real dtype, an array or tensor with ndim > 0 (a 1-element array is not a scalar), any other
            type.
    """
    want = f"{name} must be a real number (a float or int, or a 0-d array or tensor of one)"
    if is_real(v):
        return v
    arr = v
    if is_torch_tensor(v):
        dname = str(v.dtype).replace("torch.", "")
        if v.dim() != 0:
            raise TypeError(f"{want}, got a torch tensor of shape {tuple(v.shape)}{_not_scalar(v.numel(), name)}")
        if dname == "float4_e2m1fn_x2":
            raise TypeError(f"{want}, got a torch tensor of dtype float4_e2m1fn_x2 (two packed values)")
        arr = to_numpy(v, name)
        if dname == "float8_e8m0fnu":  # to_numpy gives its byte: read it as the power of two it encodes
            arr = arr.view(ml_dtypes.float8_e8m0fnu)
    elif isinstance(v, np.generic) and not isinstance(v, (bool, np.bool_)):
        arr = np.asarray(v)
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{want}, got {type(v).__name__}")
    what = "a torch tensor" if is_torch_tensor(v) else f"a numpy {type(v).__name__}"
    if arr.ndim != 0:
        raise TypeError(f"{want}, got {what} of shape {arr.shape}{_not_scalar(arr.size, name)}")
    if not _real_dtype(arr.dtype):
        raise TypeError(f"{want}, got {what} of dtype {arr.dtype}")
    return arr[()]


def float32_of(v) -> np.float32:
    """A real scalar ``v`` rounded to float32 (RNE) once; a value beyond float32 is +-inf there (no overflow
    warning), a Python int beyond float64 (10**400) too, where np.float32 itself raises OverflowError."""
    with np.errstate(over="ignore"):
        try:
            return np.float32(v)
        except OverflowError:
            return np.float32(np.inf if v > 0 else -np.inf)


def positive_float32(v, name: str) -> float:
    """``v`` (a real scalar, :func:`real_scalar`) rounded to float32 (RNE) once, as a Python float: a global decode
    scale as a kernel holds it in an fp32 register. A TypeError naming ``name`` for another type (a bool too), a
    ValueError naming it unless that float32 value is finite and > 0 (a value beyond float32, a Python int beyond
    float64 such as 10**400 included, is inf there; one below half its least subnormal is 0)."""
    v = real_scalar(v, name)  # a 0-d array or tensor: its element
    g = float(float32_of(v))
    if not (np.isfinite(g) and g > 0):
        try:
            shown = repr(float(v))
        except OverflowError:  # its size, not its 401 digits
            shown = f"({'a negative' if v < 0 else 'an'} int of {abs(v).bit_length()} bits)"
        raise ValueError(f"{name}={shown}: expected a finite positive float (the recipe's global decode scale, "
                         f"e.g. amax / (448 * 6)); as float32 it is {g!r}")
    return g


def global_scale_float32(v, name: str) -> float:
    """A global decode scale as a kernel holds it (:func:`positive_float32`): a real scalar, a 0-d array or tensor,
    or a one-element array or tensor of any shape (compressed-tensors stores it with shape [1]): its element. An
    array or tensor of more elements is a TypeError naming ``name``."""
    if getattr(v, "ndim", 0):
        size = v.size if isinstance(v, np.ndarray) else v.numel() if hasattr(v, "numel") else None
        if size == 1:
            v = v.reshape(())
    return positive_float32(v, name)


def normalize_axis(axis, ndim: int, name: str = "axis", array: str | None = None) -> int:
    """Return ``axis`` as a non-negative int, or raise ValueError/TypeError naming ``name``; with ``array`` (the
    name of the array the axis indexes) a 0-d array is refused first, by that name."""
    if array is not None and ndim == 0:
        raise ValueError(f"{array} must have at least one dimension, got a 0-d array")
    if not is_int(axis):
        raise TypeError(f"{name} must be an int, got {type(axis).__name__} {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}={axis} is out of range for an array with {ndim} dimension(s)")
    return int(axis) % ndim


def _asarray(x, name: str) -> np.ndarray:
    """np.asarray(x) for arrays, nested sequences and torch tensors, with errors that name the argument."""
    x = to_numpy(x, name)
    try:
        return np.asarray(x)
    except ValueError as exc:  # ragged nested sequences
        raise ValueError(f"{name}: not a rectangular array ({exc})") from exc


def as_code_array(x, name: str, *, nbits: int, allow_int8: bool = False) -> np.ndarray:
    """Validate an array of ``nbits``-bit codes and return it as uint8 (values unchanged; input never modified).

    int8 arrays are read as unsigned bytes (a view, not a conversion) when ``allow_int8``; otherwise every value
    must already lie in 0 .. 2**nbits - 1. A torch tensor is read through :func:`fp4ref._interop.to_numpy`
    (its bits; float8 / float4 storage dtypes come back as their bytes' ml_dtypes / uint8 views).
    """
    arr = _asarray(x, name)
    if arr.dtype == np.int8 and allow_int8:
        arr = arr.view(np.uint8)
    if arr.dtype.kind not in "ui":
        hint = ""
        if arr.dtype.kind == "V" or arr.dtype.name.startswith("float8") or arr.dtype.name.startswith("float4"):
            hint = (" (for a torch tensor's raw bytes, pass t.view(torch.uint8))" if is_torch_tensor(x) else
                    " (for an ml_dtypes array of raw bytes, pass arr.view(np.uint8))")
        raise TypeError(f"{name} must be an integer array of {nbits}-bit codes, got dtype {arr.dtype}{hint}")
    if arr.size:
        lo, hi = arr.min(), arr.max()
        if lo < 0 or hi >= (1 << nbits):
            bad = np.flatnonzero((arr < 0) | (arr >= (1 << nbits)))
            first = np.unravel_index(bad[0], arr.shape)
            raise ValueError(
                f"{name} holds {bad.size} value(s) outside the {nbits}-bit code range 0..{(1 << nbits) - 1} "
                f"(first {arr[first]} at index {tuple(int(i) for i in first)})"
            )
    return arr.astype(np.uint8, copy=False)


def as_float_array(x, name: str) -> np.ndarray:
    """Validate a floating array (float16, ml_dtypes bfloat16, float32, float64); python floats become float64.

    Integer, bool, complex and other dtypes raise TypeError: nothing is silently cast. A torch tensor is read
    through :func:`fp4ref._interop.to_numpy` (bf16 becomes ml_dtypes.bfloat16 bit for bit).
    """
    want = "a floating array (float16, bfloat16 (ml_dtypes), float32 or float64) or a Python float"
    if x is None:
        raise TypeError(f"{name} is None; expected {want}")
    if isinstance(x, (float, np.floating)):
        arr = np.asarray(x)
    else:
        arr = _asarray(x, name)
        if arr.dtype == object and isinstance(x, np.ndarray):
            raise TypeError(f"{name} is an array of dtype object; expected {want} (convert explicitly, e.g. "
                            f"{name}.astype(np.float64), if it holds numbers)")
        if arr.dtype == object:  # None inside a list, strings mixed with numbers, arbitrary objects
            raise TypeError(f"{name} is not an array-like of numbers (numpy reads the {type(x).__name__} as dtype "
                            f"object); expected {want}")
    if arr.dtype.name not in _FLOAT_NAMES:
        if arr.dtype.kind in "US":  # "1.0", b"1.0", or a list holding one: numpy reads text, not numbers
            fix = "strings (and bytes) are not numbers: parse them into floats first (e.g. float('1.0'))"
        elif arr.dtype.kind == "c":
            fix = "complex numbers are not supported: pass real floats"
        elif isinstance(x, (bool, int, list, tuple)):  # Python values: no astype to suggest
            fix = "Python ints and bools are not read as floats: write float literals (3.0) or pass a float array"
        elif arr.dtype.kind == "f":  # longdouble: wider than float64, whose conversion rounds
            fix = (f"its values are not read here because float64 would round them; {name}.astype(np.float64) "
                   "rounds each to 53 significant bits, if that is what you mean")
        else:
            fix = f"convert explicitly (e.g. {name}.astype(np.float64)) if that is what you mean"
        raise TypeError(
            f"{name} must be float16, bfloat16 (ml_dtypes), float32 or float64, got dtype {arr.dtype} "
            f"({type(x).__name__}); {fix}"
        )
    return arr


def path_option(text: str) -> str:
    """argparse ``type`` of a path option: an empty string (an unset shell variable, say) is an error, not "no
    option" (which would silently skip a report) or the current directory."""
    if not text:
        import argparse

        raise argparse.ArgumentTypeError("empty path: give the option a name")
    return text


class OnceAction(argparse.Action):
    """argparse ``action`` of an option that takes one value (an output path, the kernel, the reference, a format,
    a seed, ...): given twice it is a usage error naming both values, not the last one silently (a report asked for
    would not be written, a kernel asked for not run, a tensor asked for not quantized)."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = f"_{self.dest}_given"
        if getattr(namespace, seen, False):
            parser.error(f"{option_string} given twice ({getattr(namespace, self.dest)!r} and {values!r}): give it "
                         "once")
        setattr(namespace, seen, True)
        setattr(namespace, self.dest, values)


def help_description(doc: str | None) -> str:
    """A command's ``--help`` description from its module docstring: the first paragraph, without RST's double
    backquotes (argparse prints it as plain text)."""
    return (doc or "").split("\n\n")[0].replace("``", "")


def check_writable(path: str, flag: str, *, force: bool = False, inputs=()) -> None:
    """Raise ValueError naming ``flag`` unless a report file can be written at ``path``, checked before a long run
    (the report is written there at its end) and without truncating an existing file: a usage error found later
    must leave it as it was. An existing file is refused unless ``force`` (the command's ``--force``): no output is
    replaced without being asked. ``inputs`` (the command's input paths: files, or directories whose files it
    reads) are never written, with ``force`` or not: ``path`` may be none of them (a link to one included) and
    may not lie inside one."""
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path!r}: cannot write it (Is a directory)")
    target = os.path.realpath(path)
    for inp in inputs:
        if inp is None or not os.path.exists(inp):
            continue
        where = os.path.realpath(inp)
        # a checkpoint index's shards sit beside it: its directory is read too
        if not os.path.isdir(where) and where.endswith(".index.json"):
            where = os.path.dirname(where)
        same = os.path.exists(path) and os.path.samefile(path, inp)
        if same or target == where or (os.path.isdir(where) and target.startswith(where.rstrip(os.sep) + os.sep)):
            raise ValueError(f"{flag} {path!r} would write {'over' if same or target == where else 'inside'} the "
                             f"input {inp!r}, which is never modified; choose another path")
    existed = os.path.lexists(path)
    if existed and not force:
        raise ValueError(f"{flag} {path!r} already exists; pass --force to replace it")
    try:
        with open(path, "a"):
            pass
        if not existed:
            os.remove(path)
    except OSError as exc:
        raise ValueError(f"{flag} {path!r}: cannot write it ({exc.strerror})") from None


def check_writable_dir(path: str, flag: str, files=(), *, force: bool = False) -> None:
    """Raise ValueError naming ``flag`` unless ``files`` can be written in directory ``path`` (created at the end of
    the run if missing, with its missing parents), checked before the run: ``path`` must be a directory or not
    exist, the directory (or its nearest existing parent) must accept a new file, and none of ``files`` may exist
    there unless ``force``. Nothing is created or changed."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ValueError(f"{flag} {path}: not a directory")
    if os.path.isdir(path):
        taken = [f for f in files if os.path.lexists(os.path.join(path, f))]
        if taken and not force:
            raise ValueError(f"{flag} {path}: {', '.join(taken)} already there; pass --force to replace "
                             f"{'it' if len(taken) == 1 else 'them'}, or give a new directory (it is created)")
        where = path
    else:
        where = os.path.dirname(os.path.abspath(path))
        while not os.path.lexists(where):
            where = os.path.dirname(where)
        if not os.path.isdir(where):
            raise ValueError(f"{flag} {path}: cannot create it ({where} is not a directory)")
    try:
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as exc:
        verb = "cannot write in it" if where == path else f"cannot create it in {where}"
        raise ValueError(f"{flag} {path}: {verb} ({exc.strerror})") from None


def write_report(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: into a temporary file beside it, then renamed over it, so an
    interrupt or an error while writing leaves no partial report (and an existing file as it was)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".fp4ref-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise


#: A report option's value that means standard output (``--json -``).
STDOUT = "-"


def check_report_path(path: str, flag: str, *, force: bool = False, inputs=()) -> None:
    """:func:`check_writable` for a report option (``--json``) whose value :data:`STDOUT` (``-``) means standard
    output: nothing to check then."""
    if path != STDOUT:
        check_writable(path, flag, force=force, inputs=inputs)


def emit_report(path: str, text: str) -> None:
    """Write a report where a report option (``--json``) says: to standard output (flushed) for :data:`STDOUT`
    (``-``), else to the file ``path`` whole or not at all (:func:`write_report`)."""
    if path == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_report(path, text)


def current_umask() -> int:
    """The process's file-creation mask (read by setting and restoring it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


class Stop:
    """What stopped a CLI command that took its Ctrl-C path: ``terminated`` once SIGTERM arrived; ``word``
    ("interrupted" / "terminated") and exit ``status`` (130 / 143) for its one line."""

    def __init__(self):
        self.terminated = False

    @property
    def word(self) -> str:
        return "terminated" if self.terminated else "interrupted"

    @property
    def status(self) -> int:
        return 143 if self.terminated else 130


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While the block runs (in the main thread), SIGTERM (``kill``, ``timeout``) raises KeyboardInterrupt, so a CLI
    command takes its Ctrl-C clean-up path; yields a :class:`Stop` that says which signal it was (the command then
    exits 143 instead of 130). The first SIGINT or SIGTERM starts the clean-up and later ones are ignored until the
    block ends, so a second Ctrl-C, or the second SIGTERM GNU ``timeout`` sends to the process group, cannot break
    the clean-up half-way (a worker pool's shutdown, say); SIGKILL still ends the process. Elsewhere than the main
    thread nothing changes."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_signal(signum, frame):
        stop.terminated = signum == signal.SIGTERM
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
