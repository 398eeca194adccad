"""Safetensors checkpoints on disk: find the shards of a checkpoint, read tensors lazily in row ranges, write a
shard tensor by tensor, and publish an output atomically.

Why not only ``safetensors.safe_open`` for the data: its numpy backend cannot return F8_E4M3 / F8_E8M0 tensors
(numpy has no such dtypes), and the pages of its memory map count towards the process's resident set, so reading a
multi-GiB shard through it would make peak RSS grow with the shard. fp4ref therefore opens every shard with
``safe_open`` first (which validates the header: JSON, dtypes, shapes, offsets contiguous and inside the file) and
then reads the validated byte ranges with ``os.pread`` into buffers of its own, a row range at a time.

Writing: a safetensors file is an 8-byte little-endian header length, the JSON header (``{"name": {"dtype",
"shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``, padded with spaces to a multiple of 8) and
the tensors' bytes (format: https://github.com/huggingface/safetensors#format). :class:`ShardWriter` writes the
header first, sizes the file, and lets any process fill a tensor's byte range with ``os.pwrite``; the layout
depends only on the tensor list, so the bytes of the file do not depend on how many processes wrote it.

Layouts accepted by :func:`open_checkpoint`: one ``*.safetensors`` file; a ``*.safetensors.index.json`` (Hugging
Face sharded checkpoint: ``{"metadata": {...}, "weight_map": {tensor: shard file}}``); a directory holding
either of them (a directory with several ``*.safetensors`` files must have ``model.safetensors.index.json``).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import struct
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np

from ._validate import current_umask

__all__ = [
    "CheckpointError",
    "TensorInfo",
    "Shard",
    "Checkpoint",
    "open_checkpoint",
    "path_arg",
    "ends_in_separator",
    "ShardWriter",
    "OutputLocation",
    "DTYPES",
    "INDEX_NAME",
]

INDEX_NAME = "model.safetensors.index.json"

#: safetensors dtype string -> numpy dtype (ml_dtypes for the ones numpy lacks).
DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64), "U32": np.dtype(np.uint32), "U16": np.dtype(np.uint16), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(bool),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
}


class CheckpointError(ValueError):
    """A bad, missing, corrupt or truncated checkpoint (the message names the file and, where known, the tensor)."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a shard: name, safetensors dtype string, shape, and its absolute byte range in the file."""

    name: str
    dtype: str
    shape: tuple
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def _read_header(path: Path) -> tuple[int, dict]:
    """(data section start, header dict) of a safetensors file, checked enough to name what is wrong."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{str(path)!r} is not a readable safetensors file: {size} bytes, shorter than "
                                      "the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > 100_000_000 or 8 + n > size:
                raise CheckpointError(f"{str(path)!r} is not a readable safetensors file: header length {n} does not "
                                      f"fit the file ({size} bytes)")
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"cannot read {str(path)!r}: {e.strerror}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{str(path)!r} is not a readable safetensors file: its header is not JSON ({e})") \
            from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{str(path)!r} is not a readable safetensors file: its header is not a JSON object")
    return 8 + n, header


class Shard:
    """One safetensors file, opened lazily: ``tensors`` (name -> :class:`TensorInfo`, sorted by name) and
    ``metadata`` (the header's ``__metadata__``). Data is read with :meth:`read_rows` / :meth:`read_bytes`.

    Raises:
        CheckpointError: missing file, not a safetensors file, or a truncated one (naming the first tensor whose
        bytes lie beyond the end of the file).
    """

    def __init__(self, path):
        from safetensors import SafetensorError, safe_open

        self.path = Path(path)
        if not self.path.exists():
            raise CheckpointError(f"input file {str(self.path)!r} does not exist")
        if not self.path.is_file():
            raise CheckpointError(f"input {str(self.path)!r} is not a regular file")
        start, header = _read_header(self.path)
        size = self.path.stat().st_size
        for name, info in sorted(header.items()):
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            offs = info.get("data_offsets")
            if isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs) \
                    and start + offs[1] > size:
                raise CheckpointError(
                    f"{str(self.path)!r} is truncated: tensor {name!r} needs bytes {start + offs[0]}..{start + offs[1]}"
                    f" but the file has {size} bytes"
                )
        try:
            with safe_open(str(self.path), framework="np") as f:
                metadata = dict(f.metadata() or {})
                names = list(f.keys())
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{str(self.path)!r} is not a readable safetensors file: {e}") from None
        self.metadata = metadata
        self.data_start = start
        tensors = {}
        for name in sorted(names):
            info = header[name]
            b, e = info["data_offsets"]
            tensors[name] = TensorInfo(name, info["dtype"], tuple(int(d) for d in info["shape"]), start + b, start + e)
        self.tensors = tensors

    def read_bytes(self, name: str, begin: int, end: int) -> bytes:
        """Bytes [begin, end) of tensor ``name``'s data (offsets relative to the tensor)."""
        t = self.tensors[name]
        if not 0 <= begin <= end <= t.nbytes:
            raise ValueError(f"byte range {begin}..{end} outside tensor {name!r} ({t.nbytes} bytes)")
        want = end - begin
        try:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                chunks, got = [], 0
                while got < want:
                    b = os.pread(fd, want - got, t.begin + begin + got)
                    if not b:
                        break
                    chunks.append(b)
                    got += len(b)
            finally:
                os.close(fd)
        except OSError as e:
            raise CheckpointError(f"cannot read tensor {name!r} of {str(self.path)!r}: {e.strerror}") from None
        if got != want:
            raise CheckpointError(f"{str(self.path)!r} is truncated: tensor {name!r} ends at byte {t.end}, the file "
                                  f"ended after {t.begin + begin + got}")
        return b"".join(chunks)

    def read_rows(self, name: str, r0: int, r1: int) -> np.ndarray:
        """Rows [r0, r1) of tensor ``name`` seen as a matrix [prod(shape[:-1]), shape[-1]], as its numpy dtype.

        Raises:
            CheckpointError: truncated file; KeyError: unknown name; ValueError: dtype without a numpy type.
        """
        t = self.tensors[name]
        if t.dtype not in DTYPES:
            raise ValueError(f"tensor {name!r} of {str(self.path)!r} has dtype {t.dtype}, which fp4ref cannot read "
                             f"as numbers (readable: {sorted(DTYPES)})")
        dt = DTYPES[t.dtype]
        k = t.shape[-1] if t.shape else 1
        row = k * dt.itemsize
        data = self.read_bytes(name, r0 * row, r1 * row)
        return np.frombuffer(data, dtype=dt).reshape(r1 - r0, k)

    def read_array(self, name: str) -> np.ndarray:
        """The whole tensor in its shape (for small tensors: scales, global scales)."""
        t = self.tensors[name]
        rows = int(np.prod(t.shape[:-1], dtype=np.int64)) if t.shape else 1
        return self.read_rows(name, 0, rows).reshape(t.shape)


@dataclass
class Checkpoint:
    """A checkpoint: its directory (a lone file's own directory for ``kind`` "file"), its shards in order, the
    tensor -> shard map, the index's own ``metadata``, ``config.json`` (or None) and the other files of the
    directory to carry over (tokenizer files and the like; top level only), and its subdirectories (not carried:
    ``sub_dirs``)."""

    root: Path
    kind: str  # "file" | "index" | "directory"
    shards: list
    weight_map: dict
    index_metadata: dict = field(default_factory=dict)
    config: dict | None = None
    extra_files: list = field(default_factory=list)
    sub_dirs: list = field(default_factory=list)  # subdirectories of a model directory (never read or carried)
    json_files: dict = field(default_factory=dict)  # other top-level *.json files read (hf_quant_config.json, ...)
    has_index: bool = False

    def shard_of(self, name: str) -> Shard:
        """The shard holding tensor ``name`` (KeyError for an unknown name)."""
        return self.shards_by_name[self.weight_map[name]]

    @property
    def input_dir(self) -> Path | None:
        """The directory read as part of the checkpoint (config.json, carried files): ``root``, or None for a lone
        file, whose directory is not read."""
        return None if self.kind == "file" else self.root

    @property
    def shards_by_name(self) -> dict:
        """Shard file name -> :class:`Shard`."""
        return {s.path.name: s for s in self.shards}


_NOT_CARRIED = {INDEX_NAME, "config.json", "hf_quant_config.json"}


def _load_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise CheckpointError(f"cannot read {what} {str(path)!r}: {e.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{what} {str(path)!r} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{what} {str(path)!r} is not a JSON object")
    return data


def path_arg(value, name: str) -> Path:
    """``value`` (a str or os.PathLike naming a file or directory) as a Path.

    Raises:
        TypeError: not a str or os.PathLike. CheckpointError: an empty path (``Path("")`` would silently mean the
        current directory).
    """
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name}={value!r}: expected a path (str or os.PathLike), got {type(value).__name__}")
    if not os.fspath(value):
        raise CheckpointError(f"{name} is an empty path; give a file or directory name ('.' for the current "
                              "directory)")
    return Path(value)


def open_checkpoint(path) -> Checkpoint:
    """Open a checkpoint (see the module docstring for the layouts). Only headers are read.

    Raises:
        TypeError: ``path`` not a str or os.PathLike. CheckpointError: missing or empty path, an index naming
        missing shards or tensors a shard lacks, a directory without shards, several shards without an index, a
        corrupt or truncated shard (named).
    """
    p = path_arg(path, "input")
    if not p.exists():
        raise CheckpointError(f"input {str(p)!r} does not exist")
    if p.is_dir():
        root = p
        index = p / INDEX_NAME
        if not index.is_file():
            found = sorted(p.glob("*.safetensors.index.json"))
            index = found[0] if len(found) == 1 else None
        if index is None:
            files = sorted(p.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"directory {str(p)!r} holds no *.safetensors file")
            if len(files) > 1:
                raise CheckpointError(
                    f"directory {str(p)!r} holds {len(files)} *.safetensors files but no {INDEX_NAME}; give one file "
                    "as the input, or add the index"
                )
            kind, shard_files, index_meta, weight_map = "directory", files, {}, None
            has_index = False
        else:
            has_index = True
            kind = "directory"
            shard_files, index_meta, weight_map = _read_index(index)
    elif p.name.endswith(".index.json"):
        root = p.parent
        kind = "index"
        has_index = True
        shard_files, index_meta, weight_map = _read_index(p)
    else:
        root = p.parent
        kind = "file"
        has_index = False
        shard_files, index_meta, weight_map = [p], {}, None
    shards = [Shard(f) for f in shard_files]
    if weight_map is None:
        weight_map = {n: s.path.name for s in shards for n in s.tensors}
    else:
        by_name = {s.path.name: s for s in shards}
        for n, f in weight_map.items():
            if n not in by_name[f].tensors:
                raise CheckpointError(f"the index maps tensor {n!r} to {f!r}, which does not hold it")
        for s in shards:
            extra = sorted(set(s.tensors) - {n for n, f in weight_map.items() if f == s.path.name})
            if extra:
                raise CheckpointError(f"shard {str(s.path)!r} holds tensor {extra[0]!r}, which the index does not "
                                      "list (or maps to another shard)")
    config = None
    extra, sub_dirs, json_files = [], [], {}
    if kind != "file":
        if (root / "config.json").is_file():
            config = _load_json(root / "config.json", "config")
        if (root / "hf_quant_config.json").is_file():
            json_files["hf_quant_config.json"] = _load_json(root / "hf_quant_config.json", "ModelOpt config")
        shard_names = {s.path.name for s in shards}
        for f in sorted(root.iterdir()):
            if f.is_file() and not f.name.startswith(".") and f.name not in _NOT_CARRIED \
                    and f.name not in shard_names and not f.name.endswith(".safetensors") \
                    and not f.name.endswith(".safetensors.index.json"):
                extra.append(f)
            elif f.is_dir() and not f.name.startswith("."):
                sub_dirs.append(f)
    return Checkpoint(root=root, kind=kind, shards=shards, weight_map=weight_map, index_metadata=index_meta,
                      config=config, extra_files=extra, sub_dirs=sub_dirs, json_files=json_files,
                      has_index=has_index)


def _read_index(index: Path):
    data = _load_json(index, "index")
    wm = data.get("weight_map")
    if not isinstance(wm, dict) or not wm or not all(isinstance(v, str) for v in wm.values()):
        raise CheckpointError(f"index {str(index)!r} has no weight_map of tensor name -> shard file")
    files = []
    for name in sorted(set(wm.values())):
        if "/" in name or name.startswith("."):
            raise CheckpointError(f"index {str(index)!r} names shard {name!r} outside its directory")
        f = index.parent / name
        if not f.is_file():
            raise CheckpointError(f"index {str(index)!r} names shard {name!r}, which does not exist")
        files.append(f)
    meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    return files, meta, dict(wm)


# ----------------------------------------------------------------------------------------------------------- write


class ShardWriter:
    """Lay out a safetensors file for a known list of tensors, write its header, and size it.

    Args:
        path: the file to create (must not exist).
        entries: (name, dtype string, shape, nbytes) in the order their bytes are laid out.
        metadata: ``__metadata__`` (str -> str).

    After construction ``offsets[name]`` is the absolute byte offset of each tensor's data; fill it with
    :func:`write_at` from any process. Raises ValueError when nbytes does not match dtype and shape.
    """

    def __init__(self, path, entries, metadata: dict):
        self.path = Path(path)
        header, off = {}, 0
        for name, dt, shape, nbytes in entries:
            if dt in DTYPES and nbytes != int(np.prod(shape, dtype=np.int64)) * DTYPES[dt].itemsize:
                raise ValueError(f"tensor {name!r}: {nbytes} bytes do not match dtype {dt} and shape {list(shape)}")
            header[name] = {"dtype": dt, "shape": [int(d) for d in shape], "data_offsets": [off, off + nbytes]}
            off += nbytes
        if metadata:
            header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-(8 + len(raw)) % 8)
        start = 8 + len(raw)
        self.offsets = {name: start + h["data_offsets"][0] for name, h in header.items() if name != "__metadata__"}
        self.total_size = off
        with open(self.path, "xb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            f.truncate(start + off)


def write_at(path, offset: int, data) -> None:
    """Write ``data`` (bytes or a C-contiguous array) at absolute ``offset`` of an existing file."""
    if isinstance(data, np.ndarray):
        buf = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    else:
        buf = memoryview(data)
    fd = os.open(path, os.O_WRONLY)
    try:
        done = 0
        while done < len(buf):
            done += os.pwrite(fd, buf[done:], offset + done)
    finally:
        os.close(fd)


class OutputLocation:
    """Where an output goes and how it is published: built in a temporary sibling (``.NAME.fp4ref-tmp-PID-*``) and
    renamed onto ``target`` by :meth:`publish`; :meth:`discard` removes it. An existing target is refused unless
    ``force`` (then it is replaced only at publish time, after everything was written); a file is never replaced by
    a directory nor a directory by a file. An existing directory is replaced only by an output holding every name it
    holds (a previous output of the same checkpoint and layout): files it does not replace, or any subdirectory
    (fp4ref writes none), are refused rather than deleted. Temporary siblings left by a run that was killed (its
    process id no longer running) are removed by :meth:`create`.

    ``source``: the input :class:`Checkpoint` (None: no input to protect). The output may not be one of its shards,
    hold one, or lie inside its ``input_dir`` (a model directory or an index's is never modified; a lone file's
    output may go beside it). ``names``: the file names the new output directory will hold, when known ahead:
    an existing target directory holding other names is then refused here, before any work, rather than at
    publish.

    Raises:
        CheckpointError: target exists without force; its directory is missing, a file (named as such), not
            writable, or takes no new file (/proc, /sys: tried by creating and removing a temporary directory
            there, as :meth:`create` will); target is (or holds) an input shard, or lies inside the input's
            directory; an existing target directory holds a subdirectory, or (at publish) names the new output does
            not have.
    """

    def __init__(self, target, *, is_dir: bool, force: bool, source: Checkpoint | None = None,
                 names: set | None = None):
        self.target = Path(target)
        self.is_dir = is_dir
        parent = self.target.parent
        input_dir = None if source is None else source.input_dir
        if input_dir is not None and self.target.resolve().is_relative_to(input_dir.resolve()):
            raise CheckpointError(f"output path {str(self.target)!r} is inside the input directory "
                                  f"{str(input_dir)!r}, which is never modified; choose a path outside it")
        for shard in () if source is None else source.shards:
            s = shard.path
            if self.target.exists() and s.exists() and os.path.samefile(s, self.target):
                raise CheckpointError(f"output path {str(self.target)!r} is the input; choose another output path")
            if self.target.is_dir() and s.exists() and s.resolve().is_relative_to(self.target.resolve()):
                raise CheckpointError(f"output path {str(self.target)!r} contains the input {str(s)!r}; choose "
                                      "another output path")
            if s.resolve() == self.target.resolve():
                raise CheckpointError(f"output path {str(self.target)!r} is the input; choose another output path")
        # a file where a directory goes (or the reverse) is refused first: --force would not help
        if self.target.exists() and self.target.is_dir() != is_dir:
            kind = "directory" if self.target.is_dir() else "file"
            want = ("a directory (the output of a model directory or an index, or of a file given an output name "
                    "not ending in .safetensors)" if is_dir else "a file (one .safetensors file)")
            if is_dir and _asked_for_dir(target, self.target):
                want = (f"a directory: the output path ends in a path separator ({os.sep!r}), which asks for a "
                        "directory whatever its name")
            raise CheckpointError(f"output path {str(self.target)!r} is a {kind}; expected {want}. --force does not "
                                  f"apply: it replaces an output of the same kind only, never a {kind} with a "
                                  f"{'directory' if is_dir else 'file'}; remove it or choose another output path")
        if self.target.exists() and not force:
            raise CheckpointError(f"output {str(self.target)!r} exists; pass --force to replace it (in Python: "
                                  "force=True)")
        if not parent.is_dir():
            # the nearest path above the output that is there: a file (or other non-directory) is named as such
            there = next((a for a in (parent, *parent.parents) if os.path.lexists(a)), None)
            if there is not None and not there.is_dir():
                what = "is a file, not a directory" if there.is_file() else "is not a directory"
                where = "" if there == parent else f", so the output directory {str(parent)!r} cannot exist"
                raise CheckpointError(f"output path {str(self.target)!r}: {str(there)!r} {what}{where}; choose "
                                      "another output path")
            raise CheckpointError(f"output directory {str(parent)!r} does not exist (fp4ref quantize creates no "
                                  "parent directories)")
        # the output is built in a sibling of target: checked here, not after a pass over the weights
        if not os.access(parent, os.W_OK | os.X_OK):
            raise CheckpointError(f"output directory {str(parent)!r} is not writable (the output is built beside "
                                  f"{self.target.name!r}, then renamed onto it)")
        # access() does not see everything: root passes it whatever the mode bits, and file systems such as /proc
        # and /sys take no new file from anyone; so create() is tried now, its directory removed at once
        try:
            os.rmdir(tempfile.mkdtemp(prefix=f".{self.target.name}.fp4ref-tmp-{os.getpid()}-", dir=str(parent)))
        except OSError as e:
            raise CheckpointError(f"output path {str(self.target)!r}: cannot create files in {str(parent)!r} "
                                  f"({e.strerror}; the output is built beside it, then renamed onto it); choose "
                                  "another output path") from None
        if self.target.is_dir() and not self.target.is_symlink():
            subdirs = sorted(e.name for e in os.scandir(self.target) if e.is_dir(follow_symlinks=False))
            if subdirs:
                raise CheckpointError(f"output directory {str(self.target)!r} holds subdirectories ({_names(subdirs)}) "
                                      "that an fp4ref output never has; --force replaces a previous output only: "
                                      f"remove {_them(subdirs)} or choose another output path")
            if names is not None:
                self._refuse_extra(set(names))
        self.tmp = None

    def _refuse_extra(self, names: set) -> None:
        """Refuse an existing target directory that holds a name the new output (``names``) does not replace."""
        held = set(os.listdir(self.target))
        extra = sorted(held - names)
        if extra:
            # a checkpoint there (shards, an index, a ModelOpt config) is another input's or another layout's output
            ckpt = any(n.endswith((".safetensors", ".safetensors.index.json")) or n == "hf_quant_config.json"
                       for n in held)
            what = (": it holds the output of another checkpoint or of another layout (--checkpoint-format)"
                    if ckpt else "")
            raise CheckpointError(f"output directory {str(self.target)!r} holds {_names(extra)}, which the new "
                                  f"output does not replace{what}; --force replaces a directory only with an output "
                                  "that rewrites every file in it (a previous output of the same checkpoint and "
                                  f"layout) and never deletes a file: remove {_them(extra)} or choose another "
                                  "output path")

    def create(self) -> Path:
        """Create the temporary directory (or file path's directory) and return it."""
        _remove_stale(self.target)
        try:
            self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.fp4ref-tmp-{os.getpid()}-",
                                             dir=str(self.target.parent)))
        except OSError as e:
            raise CheckpointError(f"cannot write in {str(self.target.parent)!r}: {e.strerror}") from None
        os.chmod(self.tmp, 0o777 & ~current_umask())  # mkdtemp creates 0700: the usual permissions instead
        return self.tmp

    def publish(self, file_name: str | None = None) -> None:
        """Move the result onto the target: the temporary directory itself, or (a file output) ``file_name`` in it.
        SIGINT is held back during the renames (where the platform allows), so Ctrl-C leaves either the old output
        or the new one, never neither."""
        src = self.tmp if self.is_dir else self.tmp / file_name
        if self.is_dir and self.target.is_dir() and not self.target.is_symlink():
            self._refuse_extra(set(os.listdir(src)))  # what was written (the names given ahead, if any, agree)
        block = hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread()
        if block:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            old = None
            if self.target.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.fp4ref-old-{os.getpid()}-",
                                            dir=str(self.target.parent)))
                os.replace(self.target, old / "x")
            os.replace(src, self.target)
            tmp, self.tmp = self.tmp, None
        finally:
            if block:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        if not self.is_dir:
            shutil.rmtree(tmp, ignore_errors=True)

    def discard(self) -> None:
        """Remove the temporary output (after an error or an interrupt); the target is left as it was."""
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    @contextlib.contextmanager
    def building(self):
        """:meth:`create`, then yield the temporary path for the block to write and :meth:`publish`; on any
        exception (Ctrl-C included) :meth:`discard` it, so nothing is left behind. An OSError (e.g. the disk is
        full) becomes a CheckpointError naming the output."""
        tmp = self.create()
        try:
            yield tmp
        except OSError as e:
            self.discard()
            raise CheckpointError(f"output {str(self.target)!r} not written: {e.strerror or e}"
                                  + (f" ({e.filename})" if e.filename else "")) from None
        except BaseException:
            self.discard()
            raise


def ends_in_separator(path) -> bool:
    """Whether an output path ends in a path separator (``"out.safetensors/"``): the caller asks for a directory.
    Only a str (or an os.PathLike whose path is one) can say so: a pathlib.Path drops the trailing separator."""
    p = os.fspath(path)
    return isinstance(p, str) and p.endswith(tuple(s for s in (os.sep, os.altsep) if s))


def _asked_for_dir(given, target: Path) -> bool:
    """Whether a directory output was asked for by a trailing path separator (``-o out.safetensors/``): ``given``
    (the target as passed) ends in one, or, as a pathlib.Path drops it, ``target`` is named ``*.safetensors``:
    such a name is a directory output only when a separator asks for it (a file's output is then one file, and a
    sharded checkpoint or a model directory refuses the name: fp4ref.checkpoint's output rule)."""
    return ends_in_separator(given) or target.name.endswith(".safetensors")


def _names(names: list, most: int = 5) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _them(names: list) -> str:
    return "it" if len(names) == 1 else "them"


def _remove_stale(target: Path) -> None:
    """Remove ``.NAME.fp4ref-tmp-PID-*`` / ``-old-PID-*`` siblings of ``target`` whose process is gone (a run
    killed by SIGKILL or a power cut cannot clean up after itself); those of running processes are left alone."""
    prefix = f".{target.name}.fp4ref-"
    try:
        entries = [e for e in os.scandir(target.parent) if e.name.startswith(prefix)]
    except OSError:
        return
    for e in entries:
        kind, _, rest = e.name[len(prefix):].partition("-")
        pid = rest.split("-", 1)[0]
        if kind not in ("tmp", "old") or not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        shutil.rmtree(e.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process
        return True
    return True
