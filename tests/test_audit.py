"""``fp4ref audit`` (fp4ref/audit.py): clean outputs pass (exit 0), planted defects are flagged (exit 1): a NaN scale
byte, a negative scale byte, a zero scale over non-zero codes, a non-zero pad code, a wrong global scale (a fused
member's, caught without a reference; any tensor's, caught with --reference)."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from fp4ref import checkpoint as C
from fp4ref.audit import audit_checkpoint
from fp4ref.cli import main

from _checkpoints import EXPERTS_3D, QKV, make_checkpoint

O_PROJ = "model.layers.0.self_attn.o_proj.weight"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    base = tmp_path_factory.mktemp("audit")
    make_checkpoint(base / "in")
    C.quantize_checkpoint(base / "in", base / "mo", checkpoint_format="modelopt")
    C.quantize_checkpoint(base / "in", base / "ct", checkpoint_format="compressed-tensors")
    C.quantize_checkpoint(base / "in", base / "mx8", checkpoint_format="modelopt", fmt="mxfp8")
    return base


def patch(dirpath: Path, name: str, fn) -> None:
    """Apply ``fn`` to the raw bytes (a writable uint8 array) of tensor ``name`` wherever it is stored."""
    index = json.loads((dirpath / "model.safetensors.index.json").read_text())
    f = dirpath / index["weight_map"][name]
    data = bytearray(f.read_bytes())
    n = int.from_bytes(data[:8], "little")
    b, e = json.loads(bytes(data[8: 8 + n]))[name]["data_offsets"]
    arr = np.frombuffer(data, np.uint8)[8 + n + b: 8 + n + e].copy()
    fn(arr)
    data[8 + n + b: 8 + n + e] = arr.tobytes()
    f.write_bytes(bytes(data))


def copy(made: Path, name: str, tmp_path: Path) -> Path:
    out = tmp_path / name
    shutil.copytree(made / name, out)
    return out


def findings(report) -> dict:
    return {t.name: sorted(f.check for f in t.findings) for t in report.tensors if t.findings}


def test_clean_outputs_pass(made, capsys):
    for name in ("mo", "ct", "mx8"):
        assert main(["audit", str(made / name)]) == 0, name
        out = capsys.readouterr().out
        assert "clean" in out
    assert main(["audit", str(made / "mo"), "--reference", str(made / "in"), "--json", "-"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["clean"] and rep["checkpoint_format"] == "modelopt" and rep["format"] == "nvfp4"
    assert len(rep["tensors"]) == 20 and {t["reference"] for t in rep["tensors"]} == {"equal"}
    # the reference's other tensors (norms, embeddings, lm_head, ignored layers) were compared: the table says so
    others = len(json.loads((made / "in" / "model.safetensors.index.json").read_text())["weight_map"]) - 20
    assert rep["copied_checked"] == others > 0
    assert main(["audit", str(made / "mo"), "--reference", str(made / "in")]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"clean ({others} tensor(s) of the reference that were not quantized: equal)", last
    assert audit_checkpoint(made / "mo").copied_checked is None
    rep = audit_checkpoint(made / "ct", reference=made / "in")
    assert rep.clean and {t.reference for t in rep.tensors} == {"equal"}
    rep = audit_checkpoint(made / "mx8", reference=made / "in")
    assert rep.clean and {t.reference for t in rep.tensors} == {"equal"}


def test_planted_scale_defects(made, tmp_path, capsys):
    bad = copy(made, "mo", tmp_path)
    base = QKV[0][: -len("weight")]

    def plant(a):
        a[3] = 0x7F  # NaN
        a[5] = 0xB8  # -1.0
        a[7] = 0x80  # -0
        a[9] = 0x00  # zero scale over the block's non-zero codes

    patch(bad, base + "weight_scale", plant)
    rep = audit_checkpoint(bad)
    assert findings(rep) == {QKV[0]: ["scale-nan", "scale-negative", "zero-scale-codes"]}
    f = {x.check: x for x in next(t for t in rep.tensors if t.name == QKV[0]).findings}
    assert f["scale-nan"].count == 1 and f["scale-negative"].count == 2
    assert f["zero-scale-codes"].count == 2  # 0x00 and 0x80 (-0) over non-zero codes
    capsys.readouterr()
    assert main(["audit", str(bad), "--json", str(tmp_path / "r.json"), "--quiet"]) == 1
    assert json.loads((tmp_path / "r.json").read_text())["clean"] is False
    out, err = capsys.readouterr()  # no table, but a failed audit says so on stderr
    assert out == "" and err == f"fp4ref audit: 1 of 20 tensor(s) FAIL ({bad})\n", err
    assert main(["audit", str(bad), "--json", "-"]) == 1  # stdout holds the JSON alone; the line goes to stderr
    out, err = capsys.readouterr()
    assert json.loads(out)["clean"] is False and err == f"fp4ref audit: 1 of 20 tensor(s) FAIL ({bad})\n", err
    mx = copy(made, "mx8", tmp_path)
    patch(mx, O_PROJ[: -len("weight")] + "weight_scale", lambda a: a.__setitem__(0, 0xFF))
    patch(mx, O_PROJ, lambda a: a.__setitem__(5, 0xFF))
    assert findings(audit_checkpoint(mx)) == {O_PROJ: ["code-nan", "scale-nan"]}


def test_planted_wrong_global_scale(made, tmp_path):
    bad = copy(made, "mo", tmp_path)

    def double(a):
        v = a.view(np.float32)
        v *= 2

    patch(bad, QKV[1][: -len("weight")] + "weight_scale_2", double)  # a fused member: k_proj
    rep = audit_checkpoint(bad)
    assert set(findings(rep)) == set(QKV) and all(v == ["global-scale"] for v in findings(rep).values())
    bad2 = copy(made, "mo", tmp_path / "2")
    patch(bad2, O_PROJ[: -len("weight")] + "weight_scale_2", double)  # not fused: consistent on its own
    assert audit_checkpoint(bad2).clean
    rep = audit_checkpoint(bad2, reference=made / "in")
    assert findings(rep) == {O_PROJ: ["reference"]}
    assert "1 global scale(s)" in next(t for t in rep.tensors if t.name == O_PROJ).reference
    ct = copy(made, "ct", tmp_path)
    patch(ct, O_PROJ[: -len("weight")] + "weight_global_scale", lambda a: a.view(np.float32).__setitem__(0, -1.0))
    assert findings(audit_checkpoint(ct)) == {O_PROJ: ["global-scale"]}


def test_a_changed_code_byte_is_a_reference_difference(made, tmp_path):
    """--reference compares the element codes too, not only the scales: one nibble of o_proj's codes flipped (a
    value change the byte checks cannot see) reads "differs: 1 code byte(s), 0 scale byte(s), 0 global scale(s)"."""
    bad = copy(made, "mo", tmp_path)
    assert audit_checkpoint(bad, reference=made / "in").clean
    patch(bad, O_PROJ, lambda a: a.__setitem__(3, a[3] ^ 0x01))  # element 6's mantissa bit
    assert audit_checkpoint(bad).clean  # a valid code either way
    rep = audit_checkpoint(bad, reference=made / "in")
    assert findings(rep) == {O_PROJ: ["reference"]}
    row = next(t for t in rep.tensors if t.name == O_PROJ).reference
    assert "1 code byte(s), 0 scale byte(s), 0 global scale(s)" in row, row


def test_planted_nonzero_padding(tmp_path):
    rng = np.random.default_rng(3)
    save_file({"w.weight": rng.standard_normal((4, 20)).astype(np.float32),
               "v.weight": rng.standard_normal((4, 32)).astype(np.float32)}, str(tmp_path / "in.safetensors"))
    out = tmp_path / "q.safetensors"
    assert C.quantize_checkpoint(tmp_path / "in.safetensors", out, pad=True)[1].action == "quantized"
    assert audit_checkpoint(out, reference=tmp_path / "in.safetensors").clean
    data = bytearray(out.read_bytes())
    n = int.from_bytes(data[:8], "little")
    b, e = json.loads(bytes(data[8: 8 + n]))["w.weight"]["data_offsets"]  # [4, 16] bytes: K=20 padded to 32
    data[8 + n + b + 12] |= 0x01  # element 24 of row 0: padding
    out.write_bytes(bytes(data))
    rep = audit_checkpoint(out)
    assert findings(rep) == {"w.weight": ["padding"]}
    # --dequantize refuses it too: dropping non-zero codes would lose values where the recorded K is wrong
    with pytest.raises(C.QuantizeFileError, match=r"w.weight: 1 non-zero code\(s\) beyond the original K=20 "
                                                  r"\(stored K=32\) in rows \[0, 4\)"):
        C.dequantize_checkpoint(tmp_path / "q.safetensors", tmp_path / "d.safetensors")
    assert not (tmp_path / "d.safetensors").exists()


def test_dequantize_refuses_a_recorded_k_smaller_than_the_codes(made, tmp_path, capsys):
    """A record whose K was edited smaller (still rounding up to the stored K): audit flags the padding, and
    --dequantize, which wrote the narrower weight and dropped the columns that held values, exits 2."""
    d = copy(made, "mo", tmp_path)
    s = next(p for p in _shards(d) if O_PROJ + "_scale" in _header(p))
    meta = _header(s)["__metadata__"]
    rec = json.loads(meta["fp4ref.tensors"])
    k = rec[O_PROJ]["shape"][-1]
    rec[O_PROJ]["shape"][-1] = k - 8  # rounds up to the same 16-element blocks
    rewrite_shard(s, metadata={**meta, "fp4ref.tensors": json.dumps(rec)})
    assert findings(audit_checkpoint(d))[O_PROJ] == ["padding"]
    out = tmp_path / "deq"
    assert main(["quantize", str(d), "-o", str(out), "--dequantize", "--dtype", "bfloat16"]) == 2
    assert f"non-zero code(s) beyond the original K={k - 8}" in capsys.readouterr().err and not out.exists()


def test_bad_usage(made, tmp_path, capsys):
    assert main(["audit", str(made / "in")]) == 2
    assert "not a quantized checkpoint" in capsys.readouterr().err
    assert main(["audit", str(made / "mo"), "--recipe", "te"]) == 2
    assert "--reference only" in capsys.readouterr().err
    assert main(["audit", str(made / "mo"), "--reference", str(made / "in"), "--mode", "floor"]) == 2
    assert "(--mode) applies to mxfp4/mxfp8, not nvfp4" in capsys.readouterr().err
    assert main(["audit", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("what, name_suffix, fn, words", [
    ("NaN scale byte", "weight_scale", lambda a: a.__setitem__(3, 0x7F), "0x7f"),
    ("negative scale byte", "weight_scale", lambda a: a.__setitem__(5, 0xB8), "0xb8"),
    ("NaN global scale", "weight_scale_2", lambda a: a.__setitem__(slice(0, 4), np.frombuffer(
        np.float32("nan").tobytes(), np.uint8)), "nan"),
    ("negative global scale", "weight_scale_2", lambda a: a.__setitem__(slice(0, 4), np.frombuffer(
        np.float32(-1.0).tobytes(), np.uint8)), "-1.0"),
    ("zero global scale", "weight_scale_2", lambda a: a.__setitem__(slice(0, 4), 0), "0.0"),
])
def test_dequantize_refuses_corrupt_scales(made, tmp_path, capsys, what, name_suffix, fn, words):
    """--dequantize never turns a corrupt scale into NaN, inf, zero or negated weights: exit 2, the tensor named,
    nothing written (audit flags the same files)."""
    bad = copy(made, "mo", tmp_path)
    base = QKV[0][: -len("weight")]
    patch(bad, base + name_suffix, fn)
    out = tmp_path / "deq"
    assert main(["quantize", str(bad), "-o", str(out), "--dequantize", "--quiet"]) == 2, what
    err = capsys.readouterr().err
    assert base + name_suffix in err and words in err, err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["mo"]
    assert not audit_checkpoint(bad).clean


def test_audit_json_path_checked_before_the_run(made, tmp_path, capsys):
    assert main(["audit", str(made / "mo"), "--json", str(tmp_path / "no" / "r.json")]) == 2
    assert "--json" in capsys.readouterr().err
    assert main(["audit", str(made / "mo"), "--json", str(tmp_path)]) == 2  # a directory
    keep = tmp_path / "old.json"
    keep.write_text("old")
    assert main(["audit", str(made / "mo"), "--recipe", "te", "--json", str(keep)]) == 2  # usage error: kept
    assert keep.read_text() == "old"


def test_layers_from_a_path_and_a_named_missing_tensor(made):
    cf, fmt, _, layers = C.find_quantized_layers(made / "mo")
    assert (cf, fmt) == ("modelopt", "nvfp4") and QKV[0] in layers
    with pytest.raises(C.QuantizeFileError, match="not a quantized tensor"):
        C.read_dequantized(made / "mo", "nope.weight")


def test_a_quantized_reference_is_a_usage_error(made, capsys):
    assert main(["audit", str(made / "mo"), "--reference", str(made / "ct")]) == 2
    assert "already quantized" in capsys.readouterr().err


def test_a_missing_reference_names_the_option(made, tmp_path, capsys):
    missing = tmp_path / "nope.safetensors"
    assert main(["audit", str(made / "mo"), "--reference", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fp4ref audit: error: reference (--reference): ") and repr(str(missing)) in err, err


def test_python_errors_name_the_argument_and_are_value_errors(made, tmp_path):
    """audit_checkpoint's errors about its arguments name the Python argument (and the CLI option), not the CLI
    option alone ("--reference '...' lacks tensor ..."); a mode for an NVFP4 checkpoint is a QuantizeFileError,
    a ValueError as docs/checkpoints.md says."""
    lean = tmp_path / "lean.safetensors"
    save_file({"other.weight": np.zeros((16, 16), np.float32)}, str(lean))
    with pytest.raises(C.QuantizeFileError, match=rf"^reference={re.escape(repr(str(lean)))} \(--reference\) "
                                                  r"lacks tensor 'model\.layers\..*' of the audited checkpoint$"):
        audit_checkpoint(made / "mo", reference=lean)
    with pytest.raises(C.QuantizeFileError, match=r"^reference='.*ct' \(--reference\) is already quantized"):
        audit_checkpoint(made / "mo", reference=made / "ct")
    with pytest.raises(C.CheckpointError, match=r"^reference \(--reference\): input '.*nope' does not exist"):
        audit_checkpoint(made / "mo", reference=tmp_path / "nope")
    for kwargs, words in ((dict(mode="floor"), r"^mode='floor' \(--mode\) applies to mxfp4/mxfp8, not nvfp4"),
                          (dict(recipe="te"), r"^recipe='te' \(--recipe\) applies to nvfp4, not mxfp8")):
        ckpt = made / ("mo" if "mode" in kwargs else "mx8")
        with pytest.raises(ValueError, match=words) as info:
            audit_checkpoint(ckpt, reference=made / "in", **kwargs)
        assert isinstance(info.value, C.QuantizeFileError)


def test_dequantize_refuses_a_nan_mx_scale(made, tmp_path, capsys):
    bad = copy(made, "mx8", tmp_path)
    scale = C.output_names("modelopt", "mxfp8", QKV[0])["scale"]
    patch(bad, scale, lambda a: a.__setitem__(2, 0xFF))  # UE8M0 NaN
    assert main(["quantize", str(bad), "-o", str(tmp_path / "deq"), "--dequantize", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert scale in err and "0xff" in err
    assert "scale-nan" in findings(audit_checkpoint(bad))[QKV[0]]


def set_metadata(dirpath: Path, **kv) -> None:
    """Rewrite every shard's header ``__metadata__`` with the entries ``kv`` (the data bytes unchanged)."""
    for f in sorted(dirpath.glob("*.safetensors")):
        data = f.read_bytes()
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8: 8 + n])
        header["__metadata__"].update(kv)
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        f.write_bytes(len(h).to_bytes(8, "little") + h + data[8 + n:])


@pytest.fixture(scope="module")
def made_fp4ref(made):
    """The same checkpoint in fp4ref's own layout (the format known from the shard metadata only)."""
    C.quantize_checkpoint(made / "in", made / "fp", checkpoint_format="fp4ref")
    return made / "fp"


def checks_column(table: str) -> str:
    """The printed table's "checks" cells, their wrapped lines joined by spaces."""
    return " ".join(ln.split("│")[3].strip() for ln in table.splitlines() if ln.count("│") == 5)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -2.0])
def test_a_bad_global_scale_is_shown_with_its_tensor_and_value(made, tmp_path, capsys, value):
    """The table shows the offending value (rich markup must not swallow "[nan]") and the global-scale tensor."""
    bad = copy(made, "mo", tmp_path)
    gname = O_PROJ[: -len("weight")] + "weight_scale_2"
    patch(bad, gname, lambda a: a.view(np.float32).__setitem__(0, value))
    assert main(["audit", str(bad)]) == 1
    out = checks_column(capsys.readouterr().out)
    text = str(np.float32(value).item())
    assert f"global-scale: {gname}: 1 of 1 value(s) not finite and positive: {text}" in out, out
    rep = audit_checkpoint(bad)
    (f,) = next(t for t in rep.tensors if t.name == O_PROJ).findings
    assert f.detail == f"{gname}: 1 of 1 value(s) not finite and positive: {text}"
    fused = copy(made, "mo", tmp_path / "fused")
    patch(fused, QKV[0][: -len("weight")] + "weight_scale_2", lambda a: a.view(np.float32).__setitem__(0, value))
    assert main(["audit", str(fused)]) == 1
    out = checks_column(capsys.readouterr().out)
    assert f"'{QKV[0]}': [{text}]" in out, out  # the fused members' values, the bad one included


def test_a_failed_reference_check_is_shown_once(made, tmp_path, capsys):
    """A --reference mismatch is in the reference column, with its recipe; the checks column does not repeat it."""
    bad = copy(made, "mo", tmp_path)
    patch(bad, O_PROJ[: -len("weight")] + "weight_scale_2", lambda a: a.view(np.float32).__imul__(2))
    assert main(["audit", str(bad), "--reference", str(made / "in")]) == 1
    out = capsys.readouterr().out
    assert out.count("differs") == 1 and out.count("recipe/mode") == 1, out
    assert set(checks_column(out).split()) == {"ok"}, out  # the other checks pass on every tensor
    reference = " ".join(ln.split("│")[4].strip() for ln in out.splitlines() if ln.count("│") == 5)
    assert "differs: 0 code byte(s), 0 scale byte(s), 1 global scale(s) (recipe/mode modelopt)" in reference, out
    assert out.splitlines()[-1] == "1 of 20 tensor(s) FAIL"


def test_an_mx_reference_mismatch_counts_no_global_scales(made, tmp_path, capsys):
    """MX formats have no global scale: their reference cell counts code and scale bytes only (NVFP4's keeps the
    global-scale count, test above)."""
    bad = copy(made, "mx8", tmp_path)
    patch(bad, O_PROJ[: -len("weight")] + "weight_scale", lambda a: a.__setitem__(0, a[0] - 1 if a[0] else 1))
    rep = audit_checkpoint(bad, reference=made / "in")
    (t,) = [t for t in rep.tensors if t.reference != "equal"]
    assert t.name == O_PROJ and t.reference == "differs: 0 code byte(s), 1 scale byte(s)", t.reference
    assert main(["audit", str(bad), "--reference", str(made / "in")]) == 1
    out = capsys.readouterr().out
    reference = " ".join(ln.split("│")[4].strip() for ln in out.splitlines() if ln.count("│") == 5)
    assert "differs: 0 code byte(s), 1 scale byte(s) (recipe/mode rceil)" in reference, out
    assert "global" not in reference, out


def test_path_arguments_of_the_wrong_type_are_named(made):
    with pytest.raises(TypeError, match=r"^reference=3: expected a path \(str or os.PathLike\), got int$"):
        audit_checkpoint(made / "mo", reference=3)
    with pytest.raises(TypeError, match=r"^path=3: expected a path \(str or os.PathLike\), got int$"):
        audit_checkpoint(3)


@pytest.mark.parametrize("layout", ["mo", "fp"])
@pytest.mark.parametrize("block", ["banana", "0", "32"])
def test_a_wrong_block_in_the_metadata_is_a_finding(made, made_fp4ref, tmp_path, layout, block):
    bad = copy(made, layout, tmp_path)
    set_metadata(bad, **{"fp4ref.block": block})
    rep = audit_checkpoint(bad)
    assert not rep.clean and all("metadata" in t for t in findings(rep).values()), findings(rep)
    t = rep.tensors[0]
    assert t.findings[0].detail.endswith(f": metadata fp4ref.block={block!r}, expected '16' (the nvfp4 block size)")
    assert main(["audit", str(bad), "--quiet"]) == 1
    assert audit_checkpoint(made / layout).clean


@pytest.mark.parametrize("layout, key, value", [("mo", "fp4ref.recipe", "bogus"), ("ct", "fp4ref.recipe", "torchao"),
                                                ("mx8", "fp4ref.mode", "nope"), ("mo", "fp4ref.mode", "ocp")])
def test_a_recorded_recipe_or_mode_the_checkpoint_cannot_take_is_a_finding(made, tmp_path, capsys, layout, key,
                                                                             value):
    """An unknown recorded recipe / mode, one the layout cannot store (compressed-tensors keeps an encode scale,
    which torchao's recipe lacks) or a mode on an NVFP4 checkpoint: a metadata finding (exit 1), and --reference without
    --recipe / --mode names the metadata, not an option the user did not pass (exit 2)."""
    bad = copy(made, layout, tmp_path)
    set_metadata(bad, **{key: value})
    rep = audit_checkpoint(bad)
    assert not rep.clean and all("metadata" in t for t in findings(rep).values()), findings(rep)
    assert f"metadata {key}={value!r}: " in rep.tensors[0].findings[0].detail
    assert "(--recipe)" not in rep.tensors[0].findings[0].detail
    assert main(["audit", str(bad), "--quiet"]) == 1
    capsys.readouterr()
    if key == "fp4ref.mode" and layout == "mo":  # nvfp4 takes its recorded recipe: the bogus mode is not read
        return
    assert main(["audit", str(bad), "--reference", str(made / "in"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"recorded {key[7:]} {value!r} (fp4ref metadata)" in err and "pass --" in err


def test_an_unknown_format_in_the_metadata_is_named(made, made_fp4ref, tmp_path, capsys):
    bad = copy(made, "fp", tmp_path)  # fp4ref's layout: the metadata is the only record of the format
    set_metadata(bad, **{"fp4ref.format": "nvfp5"})
    assert main(["audit", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fp4ref audit: error: ") and err.endswith(
        ".safetensors': metadata fp4ref.format='nvfp5' is not a format fp4ref knows (nvfp4, mxfp4, mxfp8)\n"), err
    assert "no fp4ref quantization metadata" not in err
    from fp4ref.quantize_file import main as quantize_main  # the shared reader names it for --dequantize too

    assert quantize_main([str(bad), "-o", str(tmp_path / "deq"), "--dequantize", "--quiet"]) == 2
    assert "metadata fp4ref.format='nvfp5' is not a format fp4ref knows" in capsys.readouterr().err
    mo = copy(made, "mo", tmp_path)  # ModelOpt's config says nvfp4: the tensors are audited, the metadata flagged
    set_metadata(mo, **{"fp4ref.format": "nvfp5"})
    rep = audit_checkpoint(mo)
    assert rep.fmt == "nvfp4" and all(v == ["metadata"] for v in findings(rep).values()) and findings(rep)
    assert "metadata fp4ref.format='nvfp5', but the checkpoint is nvfp4" in rep.tensors[0].findings[0].detail


def test_an_unknown_layout_in_the_metadata_is_named(made, made_fp4ref, tmp_path, capsys):
    """fp4ref's layout with fp4ref.checkpoint_format of a layout fp4ref does not know: its tensor names cannot be
    read (it was read as compressed-tensors' and blamed an option the user never passed): exit 2 naming the record,
    for audit and --dequantize alike."""
    bad = copy(made, "fp", tmp_path)
    set_metadata(bad, **{"fp4ref.checkpoint_format": "bogus"})
    with pytest.raises(C.QuantizeFileError, match="fp4ref.checkpoint_format='bogus' is not a layout fp4ref knows"):
        audit_checkpoint(bad)
    assert main(["audit", str(bad)]) == 2
    assert "fp4ref.checkpoint_format='bogus' is not a layout fp4ref knows" in capsys.readouterr().err
    assert main(["quantize", str(bad), "-o", str(tmp_path / "deq"), "--dequantize", "--quiet"]) == 2
    assert "is not a layout fp4ref knows" in capsys.readouterr().err and not (tmp_path / "deq").exists()


def test_a_recipe_key_on_an_mx_checkpoint_is_not_its_mode(made, tmp_path, capsys):
    """An MX shard that also records fp4ref.recipe: a metadata finding (a recipe applies to nvfp4), and --reference
    still compares with the recorded mode (the recipe was read as the mode and blocked it)."""
    bad = copy(made, "mx8", tmp_path)
    set_metadata(bad, **{"fp4ref.recipe": "bogus"})
    rep = audit_checkpoint(bad, reference=made / "in")
    assert {t.reference for t in rep.tensors} == {"equal"}
    assert all(v == ["metadata"] for v in findings(rep).values()) and findings(rep)
    assert "fp4ref.recipe='bogus'" in rep.tensors[0].findings[0].detail


def test_an_existing_json_report_needs_force(made, tmp_path, capsys):
    keep = tmp_path / "old.json"
    keep.write_text("old")
    assert main(["audit", str(made / "mo"), "--json", str(keep), "--quiet"]) == 2
    assert capsys.readouterr().err == (f"fp4ref audit: error: --json {str(keep)!r} already exists; pass --force to "
                                       "replace it\n")
    assert keep.read_text() == "old"
    assert main(["audit", str(made / "mo"), "--json", str(keep), "--quiet", "--force"]) == 0
    assert json.loads(keep.read_text())["clean"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]  # no temporary file left beside it


def test_the_json_report_never_replaces_an_input(made, tmp_path, capsys):
    """Not with --force either: the audited checkpoint, the --reference, a link to one, or a file inside an input
    directory (a shard, the index)."""
    import os
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(made / "mo", ck)
    ref = tmp_path / "ref"
    shutil.copytree(made / "in", ref)
    shard = next(ck.glob("*.safetensors"))
    ref_shard = next(ref.glob("*.safetensors"))
    os.link(shard, tmp_path / "hard.safetensors")
    os.symlink(ref_shard, tmp_path / "soft.safetensors")
    before = {p: p.read_bytes() for p in (shard, ref_shard, ck / "model.safetensors.index.json")}
    cases = [([str(shard)], str(shard)), ([str(ck)], str(shard)),
             ([str(ck)], str(ck / "model.safetensors.index.json")),
             ([str(ck / "model.safetensors.index.json")], str(shard)),
             ([str(shard)], str(tmp_path / "hard.safetensors")),
             ([str(ck), "--reference", str(ref)], str(ref_shard)),
             ([str(ck), "--reference", str(ref)], str(tmp_path / "soft.safetensors")),
             ([str(ck)], str(ck / "new.json"))]
    for argv, out in cases:
        assert main(["audit", *argv, "--json", out, "--force", "--quiet"]) == 2, (argv, out)
        err = capsys.readouterr().err
        assert "which is never modified" in err and err.startswith("fp4ref audit: error: --json"), err
    assert {p: p.read_bytes() for p in before} == before
    assert not (ck / "new.json").exists()
    assert main(["audit", str(ck), "--json", str(tmp_path / "report.json"), "--quiet"]) == 0  # beside it: fine


def test_sigterm_takes_the_ctrl_c_path_with_status_143(made, tmp_path, capsys, monkeypatch):
    import os
    import signal

    from fp4ref import audit as A

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(A, "audit_checkpoint", killed)
    assert main(["audit", str(made / "mo"), "--json", str(tmp_path / "r.json")]) == 143
    assert capsys.readouterr().err == "fp4ref audit: terminated; no --json report written\n"
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored


def test_ctrl_c_prints_one_line_and_leaves_no_report(made, tmp_path, capsys, monkeypatch):
    from fp4ref import audit as A

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    report = tmp_path / "r.json"
    monkeypatch.setattr(A, "audit_checkpoint", interrupted)
    assert main(["audit", str(made / "mo"), "--json", str(report)]) == 130
    assert capsys.readouterr().err == "fp4ref audit: interrupted; no --json report written\n"
    assert main(["audit", str(made / "mo")]) == 130
    assert capsys.readouterr().err == "fp4ref audit: interrupted; nothing written\n"
    monkeypatch.undo()
    monkeypatch.setattr(A, "emit_report", lambda path, text: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["audit", str(made / "mo"), "--json", str(report)]) == 130
    assert capsys.readouterr().err == "fp4ref audit: interrupted; no --json report written\n"
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    monkeypatch.setattr(A, "_print_table", interrupted)  # after the report was written: it is complete
    assert main(["audit", str(made / "mo"), "--json", str(report)]) == 130
    assert capsys.readouterr().err == f"fp4ref audit: interrupted; {report} is complete\n"
    assert json.loads(report.read_text())["clean"] is True


@pytest.mark.parametrize("argv", [[""], ["X", "--json", ""], ["X", "--reference", ""]])
def test_an_empty_path_is_an_error(argv, capsys):
    with pytest.raises(SystemExit) as ex:
        main(["audit", *argv])
    assert ex.value.code == 2
    assert "empty path" in capsys.readouterr().err


def test_tensor_names_fold_on_a_narrow_terminal(made, capsys, monkeypatch):
    """An 80-column terminal: each tensor name folds over lines in its cell, never cut to "…" (the q, k, v and o
    projections would all read "model.layers.0.self_attn.…")."""
    import re

    import rich.console

    class Narrow(rich.console.Console):
        def __init__(self, *a, **kw):
            super().__init__(*a, **{**kw, "width": 80})

        is_terminal = property(lambda self: True)

    monkeypatch.setattr(rich.console, "Console", Narrow)
    assert main(["audit", str(made / "mo"), "--reference", str(made / "in")]) == 0
    out = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", capsys.readouterr().out)
    rows = [ln.split("│") for ln in out.splitlines() if ln.startswith("│")]
    assert rows and max(len(ln) for ln in out.splitlines()) <= 80 and "…" not in out, out
    assert O_PROJ in "".join(r[1].strip() for r in rows)


def test_config_groups_and_ignore_regexes_a_loader_needs(made, tmp_path):
    """compressed-tensors: a quantization_config without config_groups (no weight scheme for a loader) and an
    ignore entry "re:[" (not a regular expression: a loader fails on it) are config findings."""
    d = copy(made, "ct", tmp_path)
    _edit_json(d / "config.json", lambda c: c["quantization_config"].pop("config_groups"))
    assert any("has no config_groups" in x for x in _config_details(d))
    d2 = copy(made, "ct", tmp_path / "2")
    _edit_json(d2 / "config.json", lambda c: c["quantization_config"]["ignore"].append("re:["))
    assert any("entry 're:[' is not a valid regular expression" in x for x in _config_details(d2))


def test_force_without_json_is_a_usage_error(made, capsys):
    """--force replaces an existing --json FILE: alone it would do nothing, so it is refused (exit 2)."""
    for extra in ([], ["--json", "-"]):
        assert main(["audit", str(made / "mo"), "--force", *extra]) == 2
        assert "--force applies with --json FILE only" in capsys.readouterr().err


def test_python_recipe_or_mode_without_reference_is_refused_as_the_cli_refuses(made):
    """recipe / mode without reference are a ValueError (the CLI: "--recipe / --mode apply with --reference only"),
    not a silently clean report; a value of the wrong type is a TypeError naming the argument, with or without
    reference."""
    from fp4ref.blockscale import MXMode, NVFP4Recipe

    for kwargs in (dict(recipe="bogus"), dict(recipe="te"), dict(recipe=NVFP4Recipe.TE), dict(mode="nonsense"),
                   dict(mode=MXMode.FLOOR)):
        (arg, value), = kwargs.items()
        with pytest.raises(ValueError, match=rf"^{arg}={re.escape(repr(value))} applies with reference only "
                                             rf"\(the original checkpoint, re-quantized with that {arg} and compared "
                                             rf"byte for byte\); pass reference=\.\.\. or leave {arg} out$"):
            audit_checkpoint(made / "mo", **kwargs)
    for reference in (None, made / "in"):
        with pytest.raises(TypeError, match=r"^recipe=123: expected an NVFP4Recipe or one of its names \['te', "):
            audit_checkpoint(made / "mo", reference=reference, recipe=123)
        with pytest.raises(TypeError, match=r"^mode=1\.5: expected an MXMode or one of its names \["):
            audit_checkpoint(made / "mx8", reference=reference, mode=1.5)
    # with reference: an unknown name is refused with the names, an empty one is not read as "the recorded one"
    for bad in ("bogus", ""):
        with pytest.raises(ValueError, match=rf"recipe={bad!r} \(--recipe\) is not one of \['te', "):
            audit_checkpoint(made / "mo", reference=made / "in", recipe=bad)
    assert audit_checkpoint(made / "mo", reference=made / "in", recipe="modelopt").clean


def strip_fp4ref_metadata(shard: Path) -> None:
    """Rewrite ``shard``'s header ``__metadata__`` without fp4ref's entries (a shard re-saved by another tool)."""
    data = shard.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8: 8 + n])
    header["__metadata__"] = {k: v for k, v in header["__metadata__"].items() if not k.startswith("fp4ref.")}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    shard.write_bytes(len(h).to_bytes(8, "little") + h + data[8 + n:])


def test_shards_recording_different_recipes_are_a_metadata_finding(made, tmp_path):
    """One quantize run records one recipe in every shard: a shard whose fp4ref.recipe was changed to another valid
    one (torchao, where the others say modelopt) is a metadata finding on the layers of every shard that records
    one, naming both values (it passed as clean, and --reference used one shard's recipe for all)."""
    bad = copy(made, "mo", tmp_path)
    index = json.loads((bad / "model.safetensors.index.json").read_text())
    first, second = sorted(set(index["weight_map"].values()))
    data = (bad / second).read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8: 8 + n])
    assert header["__metadata__"]["fp4ref.recipe"] == "modelopt"
    header["__metadata__"]["fp4ref.recipe"] = "torchao"
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    (bad / second).write_bytes(len(h).to_bytes(8, "little") + h + data[8 + n:])
    rep = audit_checkpoint(bad)
    assert not rep.clean and all(v == ["metadata"] for v in findings(rep).values())
    details = {f.detail for t in rep.tensors for f in t.findings}
    assert details == {f"{s}: the shards record different fp4ref.recipe values ('modelopt' in {first}, 'torchao' in "
                       f"{second})" for s in (first, second)}, details


@pytest.mark.parametrize("layout", ["mo", "ct"])
def test_a_shard_without_fp4ref_metadata_is_still_audited_and_dequantized(made, tmp_path, layout):
    """A shard that lost fp4ref's metadata while the others keep it: its layers are found from their scale tensors,
    so a planted NaN scale there is flagged and --dequantize decodes them (neither skips the shard)."""
    bad = copy(made, layout, tmp_path)
    _, _, _, layers = C.find_quantized_layers(made / layout)
    index = json.loads((bad / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    second = sorted(n for n, L in layers.items() if L.shard == shards[1])
    assert len(shards) == 2 and second and len(second) < len(layers)
    strip_fp4ref_metadata(bad / shards[1])
    _, _, _, found = C.find_quantized_layers(bad)
    assert sorted(found) == sorted(layers)
    assert found[second[0]].shard == shards[1] and found[second[0]].dtype is None  # no record: dtype unknown
    patch(bad, layers[second[0]].scale, lambda a: a.__setitem__(0, 0x7F))
    rep = audit_checkpoint(bad)
    assert len(rep.tensors) == len(layers) and findings(rep) == {second[0]: ["scale-nan"]}
    patch(bad, layers[second[0]].scale, lambda a: a.__setitem__(0, 0x38))  # 1.0: a valid scale again
    C.dequantize_checkpoint(bad, tmp_path / "deq", dtype="bfloat16")
    out = json.loads((tmp_path / "deq" / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(layers) <= set(out) and not {L.scale for L in layers.values()} & set(out)


def test_an_fp4ref_layout_shard_without_its_record_is_an_error(made, made_fp4ref, tmp_path, capsys):
    """In fp4ref's own layout the layers are known from fp4ref.tensors only: a shard without it is refused (exit 2
    for audit and --dequantize), never audited or decoded in part."""
    bad = copy(made, "fp", tmp_path)
    shard = sorted(bad.glob("*.safetensors"))[1]
    strip_fp4ref_metadata(shard)
    with pytest.raises(C.QuantizeFileError, match=rf"{re.escape(shard.name)}' has no fp4ref.tensors metadata"):
        audit_checkpoint(bad)
    assert main(["audit", str(bad)]) == 2
    assert main(["quantize", str(bad), "-o", str(tmp_path / "deq"), "--dequantize"]) == 2
    assert "has no fp4ref.tensors metadata" in capsys.readouterr().err
    assert not (tmp_path / "deq").exists()


def rewrite_shard(shard: Path, *, drop=(), add=None, metadata=None) -> None:
    """Rewrite a shard's header and data: without the tensors ``drop``, with ``add`` ({name: (dtype, shape, raw
    bytes)}) and, when given, ``metadata`` as its ``__metadata__``; the index follows the tensors."""
    data = shard.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8: 8 + n])
    meta = header.pop("__metadata__", {}) if metadata is None else metadata
    header.pop("__metadata__", None)
    body = data[8 + n:]
    tensors = {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]: v["data_offsets"][1]])
               for k, v in header.items() if k not in drop}
    tensors.update(add or {})
    out, blob = {"__metadata__": meta}, b""
    for k, (dt, shape, raw) in sorted(tensors.items()):
        out[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    h = json.dumps(out, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    shard.write_bytes(len(h).to_bytes(8, "little") + h + blob)
    index_path = shard.parent / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    wm = {k: v for k, v in index["weight_map"].items() if k not in drop}
    wm.update({k: shard.name for k in add or {}})
    index["weight_map"] = wm
    index_path.write_text(json.dumps(index))


def _shards(d: Path) -> list:
    return sorted(d.glob("*.safetensors"))


def _header(shard: Path) -> dict:
    data = shard.read_bytes()
    return json.loads(data[8: 8 + int.from_bytes(data[:8], "little")])


def _refused(tmp_path, capsys, d: Path, words: str) -> None:
    """audit_checkpoint raises QuantizeFileError with ``words``; the CLI's audit and --dequantize exit 2 and write
    nothing."""
    with pytest.raises(C.QuantizeFileError, match=words):
        audit_checkpoint(d)
    assert main(["audit", str(d)]) == 2
    out = tmp_path / f"deq-{d.name}"
    assert main(["quantize", str(d), "-o", str(out), "--dequantize", "--dtype", "bfloat16"]) == 2
    assert re.search(words, capsys.readouterr().err) and not out.exists()


@pytest.mark.parametrize("layout", ["mo", "ct", "fp"])
def test_a_shard_with_another_shards_record_is_refused(made, made_fp4ref, tmp_path, capsys, layout):
    """A tool that copies shard 1's __metadata__ onto shard 2 leaves shard 2's layers out of its record: audit said
    clean over them and --dequantize copied their codes as weights. Such a record (or an emptied one) is refused."""
    d = copy(made, layout, tmp_path)
    s1, s2 = _shards(d)
    rewrite_shard(s2, metadata=_header(s1)["__metadata__"])
    _refused(tmp_path, capsys, d, "fp4ref.tensors lists .*codes tensor .* is in model-00001")
    d2 = copy(made, layout, tmp_path / "empty")
    s2 = _shards(d2)[1]
    rewrite_shard(s2, metadata={**_header(s2)["__metadata__"], "fp4ref.tensors": "{}"})
    _refused(tmp_path, capsys, d2, "quantized layer .* that the shard's fp4ref.tensors metadata does not list")


@pytest.mark.parametrize("record", ['[1, 2]', '5', '"x"', '{"a.weight": {"shape": 5, "dtype": "BF16"}}',
                                    '{"a.weight": {"shape": [4, 16], "dtype": "I8"}}',
                                    '{"' + O_PROJ + '": {"shape": [64, 64], "dtype": "U8"}}',  # a recorded layer
                                    '{"' + O_PROJ + '": {"shape": [64, 64], "dtype": "F64"}}',
                                    '{"' + O_PROJ + '": {"shape": [64, 64], "dtype": "BF16", "foo": 1}}',
                                    '{"a.weight": {"shape": [4, true], "dtype": "BF16"}}'])
def test_a_malformed_record_is_refused(made, tmp_path, capsys, record):
    d = copy(made, "mo", tmp_path)
    s1 = _shards(d)[0]
    rewrite_shard(s1, metadata={**_header(s1)["__metadata__"], "fp4ref.tensors": record})
    _refused(tmp_path, capsys, d, "metadata fp4ref.tensors")


@pytest.mark.parametrize("layout", ["mo", "ct"])
def test_codes_without_their_scale_are_refused(made, tmp_path, capsys, layout):
    """A shard without fp4ref's record whose layer lost its scale tensor: the codes were copied as a weight."""
    d = copy(made, layout, tmp_path)
    _, _, _, layers = C.find_quantized_layers(made / layout)
    s2 = _shards(d)[1]
    name = sorted(n for n, L in layers.items() if L.shard == s2.name and n.endswith(".weight"))[0]
    strip_fp4ref_metadata(s2)
    rewrite_shard(s2, drop=(layers[name].scale,))
    _refused(tmp_path, capsys, d, "looks like the codes of a quantized layer, but its scale tensor .* is missing")


# (fp4ref's layout refuses a shard without its record before any layer is looked at: recorded only)
@pytest.mark.parametrize("layout, recorded", [("mo", True), ("mo", False), ("ct", True), ("ct", False), ("fp", True)])
def test_a_scale_without_its_codes_is_refused(made, made_fp4ref, tmp_path, capsys, layout, recorded):
    """A layer whose codes tensor is gone leaves nothing to check or dequantize: exit 2 naming the codes tensor
    (from the shard's record, or from the scale tensor left behind)."""
    d = copy(made, layout, tmp_path)
    _, _, _, layers = C.find_quantized_layers(made / layout)
    s2 = _shards(d)[1]
    name = sorted(n for n, L in layers.items() if L.shard == s2.name)[0]
    if not recorded:
        strip_fp4ref_metadata(s2)
    rewrite_shard(s2, drop=(layers[name].codes,))
    codes = re.escape(repr(layers[name].codes))
    _refused(tmp_path, capsys, d, f"codes tensor {codes} is missing from the checkpoint$" if recorded
             else f"scale tensor .* has no codes tensor {codes}$")


def test_a_tensor_beside_its_layers_codes_is_refused(made, tmp_path, capsys):
    """compressed-tensors: an X.weight beside X.weight_packed would collide with the dequantized X.weight (the
    output shard had a duplicate key)."""
    d = copy(made, "ct", tmp_path)
    s1 = _shards(d)[0]
    raw = np.ones((4, 4), ml_dtypes.bfloat16).tobytes()
    rewrite_shard(s1, add={O_PROJ: ("BF16", [4, 4], raw)})
    _refused(tmp_path, capsys, d, "is stored beside the codes")


def test_dequantize_refuses_layout_problems_that_audit_reports(made, tmp_path, capsys):
    """--dequantize checks each layer's layout first (it read a missing global as a KeyError, a [2] per-expert global
    of 4 experts as an IndexError, and reused a scalar one for every expert)."""
    d = copy(made, "mo", tmp_path)
    s = next(p for p in _shards(d) if O_PROJ + "_scale_2" in _header(p))
    rewrite_shard(s, drop=(O_PROJ + "_scale_2",))
    assert findings(audit_checkpoint(d))[O_PROJ] == ["layout"]
    assert main(["quantize", str(d), "-o", str(tmp_path / "deq"), "--dequantize", "--dtype", "bfloat16"]) == 2
    assert "weight_scale_2 is missing" in capsys.readouterr().err and not (tmp_path / "deq").exists()
    d2 = copy(made, "mo", tmp_path / "moe")
    g = EXPERTS_3D[0] + "_weight_scale_2"
    s = next(p for p in _shards(d2) if g in _header(p))
    rewrite_shard(s, drop=(g,), add={g: ("F32", [], np.float32(0.01).tobytes())})
    assert findings(audit_checkpoint(d2))[EXPERTS_3D[0]] == ["layout"]
    assert main(["quantize", str(d2), "-o", str(tmp_path / "deq2"), "--dequantize", "--dtype", "bfloat16"]) == 2
    assert "expected F32 [4]" in capsys.readouterr().err


@pytest.mark.parametrize("layout, what", [("mo", "scale"), ("mo", "global"), ("mo", "short"), ("mx8", "scale"),
                                          ("mx8", "short")])
def test_a_layout_problem_with_a_reference_is_a_finding(made, tmp_path, capsys, layout, what):
    """--reference over a layer whose scale (or global scale) is missing or of the wrong shape: the layout finding,
    exit 1, the reference column "- (layout)" (it raised KeyError / AttributeError, or exited 2 on a reshape)."""
    d = copy(made, layout, tmp_path)
    _, _, _, layers = C.find_quantized_layers(d)
    L = layers[O_PROJ]
    name = L.scale if what != "global" else O_PROJ + "_scale_2"
    s = next(p for p in _shards(d) if name in _header(p))
    if what == "short":
        info = _header(s)[name]
        rows, cols = info["shape"]
        raw = np.zeros((rows, cols // 2), np.uint8).tobytes()
        rewrite_shard(s, drop=(name,), add={name: (info["dtype"], [rows, cols // 2], raw)})
    else:
        rewrite_shard(s, drop=(name,))
    report = audit_checkpoint(d, reference=made / "in")
    row = next(r for r in report.tensors if r.name == O_PROJ)
    assert [f.check for f in row.findings] == ["layout"] and row.reference == "- (layout)"
    assert all(r.reference == "equal" for r in report.tensors if r.name != O_PROJ)
    assert main(["audit", str(d), "--reference", str(made / "in")]) == 1
    out = capsys.readouterr().out
    assert "- (layout)" in out and "Traceback" not in out


def test_reference_checks_the_tensors_that_were_not_quantized(made, tmp_path, capsys):
    """With --reference, the original's other tensors (embeddings, norms, lm_head, layers left unquantized) must be
    in the checkpoint unchanged: a dropped one, one with a changed byte and one stored in another dtype are
    checkpoint-wide reference findings (exit 1); the quantized layers' rows stay "equal"."""
    d = copy(made, "mo", tmp_path)
    norm, emb, head = "model.norm.weight", "model.embed_tokens.weight", "lm_head.weight"
    s_norm = next(p for p in _shards(d) if norm in _header(p))
    rewrite_shard(s_norm, drop=(norm,))
    patch(d, emb, lambda a: a.__setitem__(7, a[7] ^ 0x01))  # one mantissa bit of one element
    s_head = next(p for p in _shards(d) if head in _header(p))
    info = _header(s_head)[head]
    raw = np.zeros(info["shape"], np.float32).tobytes()
    rewrite_shard(s_head, drop=(head,), add={head: ("F32", info["shape"], raw)})
    rep = audit_checkpoint(d, reference=made / "in")
    assert not rep.clean and {t.reference for t in rep.tensors} == {"equal"}
    details = {f.detail for f in rep.findings if f.check == "reference"}
    assert details == {f"1 tensor(s) of the reference are missing: {norm}",
                       f"2 tensor(s) not quantized differ from the reference: {head} (BF16 {info['shape']} stored "
                       f"as F32 {info['shape']}), {emb} (bytes differ)"}, details  # (sorted by name)
    assert main(["audit", str(d), "--reference", str(made / "in")]) == 1
    out = capsys.readouterr().out
    assert "checkpoint reference: 1 tensor(s) of the reference are missing" in out
    assert audit_checkpoint(d).clean  # without --reference these are not checked


def test_nan_or_undecodable_values_are_refused_by_dequantize(made, tmp_path, capsys):
    """A compressed-tensors global encode scale whose fp32 reciprocal is inf (1e-39, a subnormal) is an audit
    finding and a --dequantize error (it wrote NaN and inf weights); so is an MXFP8 NaN element code."""
    d = copy(made, "ct", tmp_path)
    patch(d, O_PROJ[: -len("weight")] + "weight_global_scale",
          lambda a: a.view(np.float32).__setitem__(0, np.float32(1e-39)))
    assert findings(audit_checkpoint(d)) == {O_PROJ: ["global-scale"]}
    assert main(["quantize", str(d), "-o", str(tmp_path / "deq"), "--dequantize", "--dtype", "bfloat16"]) == 2
    assert "no finite fp32 reciprocal" in capsys.readouterr().err and not (tmp_path / "deq").exists()
    mo = copy(made, "mo", tmp_path)  # 3e38 is finite, but the layer's largest code x block scale x 3e38 is not
    patch(mo, O_PROJ[: -len("weight")] + "weight_scale_2", lambda a: a.view(np.float32).__setitem__(0, 3e38))
    assert findings(audit_checkpoint(mo)) == {O_PROJ: ["decode-overflow"]}
    assert main(["quantize", str(mo), "-o", str(tmp_path / "deq4"), "--dequantize", "--dtype", "float32"]) == 2
    assert "no dtype --dequantize writes is wider" in capsys.readouterr().err and not (tmp_path / "deq4").exists()
    mx = copy(made, "mx8", tmp_path)
    patch(mx, O_PROJ, lambda a: a.__setitem__(5, 0x7F))
    assert findings(audit_checkpoint(mx)) == {O_PROJ: ["code-nan"]}
    assert main(["quantize", str(mx), "-o", str(tmp_path / "deq8"), "--dequantize", "--dtype", "bfloat16"]) == 2
    assert "element code 0x7f" in capsys.readouterr().err and not (tmp_path / "deq8").exists()


def test_decode_overflow_is_what_the_stored_values_reach(tmp_path, capsys):
    """An MXFP8 scale byte raised to 254 (2^127) makes its block decode beyond float32: a decode-overflow finding
    (audit passed it), and --dequantize says no dtype is wider. An NVFP4 weight near float32's maximum quantized by
    a 4over6 recipe with E4M3 max 256 (global decode scale amax / 1536) decodes within float32 (at most the amax):
    clean (the old rule, 6 x 448 x the global decode scale, called it an overflow), and dequantized exactly."""
    w = np.random.default_rng(4).uniform(1e38, 2e38, (2, 32)).astype(np.float32)  # every block near the top
    w[0, 0] = 2e38
    src = tmp_path / "w.safetensors"
    save_file({"w": w}, str(src))
    q4 = tmp_path / "q4.safetensors"
    assert main(["quantize", str(src), "-o", str(q4), "--recipe", "te-4over6-256", "--quiet"]) == 0
    assert audit_checkpoint(q4).clean
    assert main(["quantize", str(q4), "-o", str(tmp_path / "d4.safetensors"), "--dequantize", "--quiet"]) == 0
    back = load_file(str(tmp_path / "d4.safetensors"))["w"]
    assert np.isfinite(back).all() and back[0, 0] == np.float32(2e38)  # the block amax decodes to itself
    q8 = tmp_path / "q8.safetensors"
    assert main(["quantize", str(src.with_name("w.safetensors")), "-o", str(q8), "--format", "mxfp8",
                 "--quiet"]) == 0
    assert audit_checkpoint(q8).clean
    raw = bytearray(q8.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    at = 8 + n + json.loads(raw[8:8 + n])["w_scale"]["data_offsets"][0] + 1  # row 1's scale byte (K = 32: one
    raw[at] = 254  # block per row): 2^127 times its element codes
    q8.write_bytes(bytes(raw))
    rep = audit_checkpoint(q8)
    assert findings(rep) == {"w": ["decode-overflow"]}
    detail = next(f.detail for t in rep.tensors for f in t.findings)
    assert "beyond float32" in detail, detail
    assert main(["quantize", str(q8), "-o", str(tmp_path / "d8.safetensors"), "--dequantize", "--dtype",
                 "float32"]) == 2
    assert "no dtype --dequantize writes is wider" in capsys.readouterr().err


def test_decode_overflow_per_expert_and_not_in_the_padding(made, tmp_path):
    """An MoE's per-expert global scales: expert 0's set to 0 (a global-scale finding) does not hide expert 1's
    3e35, whose decode overflows float32 (decode-overflow naming expert 1). Padding codes beyond K are never decoded:
    a padding code 6 under a large block scale is a padding finding only."""
    d = copy(made, "mo", tmp_path)

    def experts(a):
        v = a.view(np.float32)
        v[0], v[1] = 0.0, 3e35

    patch(d, EXPERTS_3D[0] + "_weight_scale_2", experts)
    rep = audit_checkpoint(d)
    assert findings(rep)[EXPERTS_3D[0]] == ["decode-overflow", "global-scale"]
    detail = next(f.detail for t in rep.tensors for f in t.findings if f.check == "decode-overflow")
    assert "(expert(s) [1])" in detail, detail
    w = np.ones((1, 40), np.float32)
    w[0, :32] = 2e38  # block 0 near the top; block 1: columns 32-39 real (1.0), 40-63 padding
    src, q = tmp_path / "w.safetensors", tmp_path / "q.safetensors"
    save_file({"w": w}, str(src))
    C.quantize_checkpoint(src, q, fmt="mxfp4", pad=True)
    raw = bytearray(q.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    codes_at = 8 + n + header["w"]["data_offsets"][0]
    raw[codes_at + 16:codes_at + 20] = b"\x22" * 4  # elements 32-39: code 2 (1.0)
    raw[codes_at + 20] = 0x07  # element 40 (padding): code 7, 6.0
    raw[8 + n + header["w_scale"]["data_offsets"][0] + 1] = 253  # block 1: 2^126 (1.0 x 2^126 fits float32)
    q.write_bytes(bytes(raw))
    assert findings(audit_checkpoint(q)) == {"w": ["padding"]}


def _edit_json(path: Path, fn) -> None:
    d = json.loads(path.read_text())
    fn(d)
    path.write_text(json.dumps(d))


def _config_details(d: Path) -> list:
    rep = audit_checkpoint(d)
    assert not findings(rep), findings(rep)  # the tensors are fine: only the checkpoint-wide check fails
    return [f.detail for f in rep.findings if f.check == "config"]


@pytest.mark.parametrize("edit, words", [
    # (hf_quant_config.json decides the detected format: config.json's quant_algo is the one checked against it)
    (lambda h, c: c["quantization_config"].__setitem__("quant_algo", "MXFP8"), "config.json quantization_config "
                                                                               "quant_algo='MXFP8', but the tensors "
                                                                               "are nvfp4"),
    (lambda h, c: h["quantization"].__setitem__("group_size", 32), "group_size=32, but the nvfp4 block is 16"),
    (lambda h, c: h["quantization"]["exclude_modules"].append("model.layers.0.self_attn.o_proj"),
     "exclude_modules lists 1 quantized layer"),
    (lambda h, c: c["quantization_config"]["ignore"].append("model.layers.*.mlp.*_proj"),
     r"ignore lists \d+ quantized layer\(s\) \(e.g. 'model.layers.0.mlp.gate_proj.weight' by "
     r"'model.layers.\*.mlp.\*_proj'\)"),
    (lambda h, c: (h["quantization"].__setitem__("quant_algo", "NVFP4"),
                   c["quantization_config"].__setitem__("quant_algo", "NVFP4")),
     "quant_algo 'NVFP4' .* have no input_scale"),
])
def test_loader_config_that_disagrees_with_the_tensors_is_a_finding(made, tmp_path, capsys, edit, words):
    """A loader reads hf_quant_config.json / config.json, not the shards: a wrong format, block or exclusion there
    misreads a checkpoint whose tensors are all fine (the audit said clean; exit 0)."""
    d = copy(made, "mo", tmp_path)
    hf, cfg = json.loads((d / "hf_quant_config.json").read_text()), json.loads((d / "config.json").read_text())
    edit(hf, cfg)
    (d / "hf_quant_config.json").write_text(json.dumps(hf))
    (d / "config.json").write_text(json.dumps(cfg))
    details = _config_details(d)
    assert len(details) >= 1 and any(re.search(words, t) for t in details), details
    assert main(["audit", str(d), "--json", "-"]) == 1
    out, err = capsys.readouterr()
    rep = json.loads(out)
    assert rep["clean"] is False and rep["findings"][0]["check"] == "config"
    n = len(rep["findings"])  # no tensor fails: the summary line names the checkpoint findings alone
    assert err == f"fp4ref audit: {n} checkpoint finding(s) ({d})\n", err
    assert main(["audit", str(d)]) == 1
    assert "checkpoint config:" in capsys.readouterr().out


def test_compressed_tensors_config_is_checked(made, tmp_path):
    d = copy(made, "ct", tmp_path)
    _edit_json(d / "config.json", lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(
        num_bits=8, group_size=32))
    details = _config_details(d)
    assert any("num_bits=8, but nvfp4 elements have 4 bits" in t for t in details), details
    assert any("group_size=32, but the nvfp4 block is 16" in t for t in details), details
    d2 = copy(made, "ct", tmp_path / "re")
    _edit_json(d2 / "config.json", lambda c: c["quantization_config"]["ignore"].append("re:.*self_attn\\.[qkv]_proj$"))
    assert any("ignore lists 3 quantized layer(s)" in t for t in _config_details(d2))
    d3 = copy(made, "ct", tmp_path / "none")
    _edit_json(d3 / "config.json", lambda c: c.pop("quantization_config"))  # the shard metadata still says the layout
    assert _config_details(d3) == ["config.json has no quantization_config: a loader cannot tell the checkpoint is "
                                   "quantized"]


def test_shard_metadata_naming_another_layout_is_a_finding(made, tmp_path):
    d = copy(made, "mo", tmp_path)
    s2 = _shards(d)[1]
    rewrite_shard(s2, metadata={**_header(s2)["__metadata__"], "fp4ref.checkpoint_format": "compressed-tensors"})
    rep = audit_checkpoint(d)
    assert {c for v in findings(rep).values() for c in v} == {"metadata"}
    assert all(t.name in C.find_quantized_layers(d)[3] for t in rep.tensors)
