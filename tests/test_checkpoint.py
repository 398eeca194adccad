"""``fp4ref quantize`` on checkpoints (fp4ref/checkpoint.py): a Llama-like bf16 checkpoint with 2 shards + index,
fused q/k/v and gate/up, a MoE layer (router, per-expert Linear weights, 3-D expert tensors), in the ModelOpt and
compressed-tensors layouts; round trips; --jobs; safety (existing output, Ctrl-C, corrupt input); --dry-run.

Expected values are computed here, independently of fp4ref's quantizer: bytes read with safetensors, E2M1 decoded by
a hand table, E4M3 by ml_dtypes, global scales from the bf16 input's amax in numpy float32, and ModelOpt's block
scale and element arithmetic (NVFP4QTensor.quantize, nvidia-modelopt 0.47.0) written out in numpy float32.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from fp4ref import checkpoint as C
from fp4ref.quantize_file import main

from _checkpoints import DOWN72, EXPERTS_3D, GATE_UP, IGNORED, QKV, SHARD1, SHARD2, group_of, make_checkpoint

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
MAG = E2M1[:8]


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> tuple:
    root = tmp_path_factory.mktemp("llama") / "in"
    return root, make_checkpoint(root)


@pytest.fixture(scope="module")
def modelopt_out(src, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mo") / "out"
    C.quantize_checkpoint(src[0], out, checkpoint_format="modelopt")
    return out


def raw(dirpath: Path) -> dict:
    """name -> (dtype string, shape, numpy array of the raw bytes as stored), over every shard of a directory."""
    out = {}
    for f in sorted(dirpath.glob("*.safetensors")):
        with safe_open(str(f), framework="np") as h:
            for n in h.keys():
                s = h.get_slice(n)
                out[n] = (s.get_dtype(), tuple(s.get_shape()), f.name)
        data = f.read_bytes()
        header = json.loads(data[8: 8 + int.from_bytes(data[:8], "little")])
        start = 8 + int.from_bytes(data[:8], "little")
        for n, h in header.items():
            if n != "__metadata__":
                b, e = h["data_offsets"]
                out[n] = out[n] + (data[start + b: start + e],)
    return out


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def amax(x) -> np.float32:
    return np.max(np.abs(f32(x)))


def e2m1_rne(q: np.ndarray) -> np.ndarray:
    """E2M1 codes of float32 quotients: nearest magnitude (saturating at 6), ties to the even code; sign = q < 0."""
    a = np.minimum(np.abs(q.astype(np.float64)), 6.0)
    d = np.abs(a[..., None] - MAG)
    best = np.argmin(d, axis=-1)
    tie = np.isclose(np.sort(d, axis=-1)[..., 1], np.min(d, axis=-1), rtol=0, atol=0)
    up = np.minimum(best + 1, 7)
    best = np.where(tie & (best % 2 == 1), up, best)
    return (best + 8 * (q < 0)).astype(np.uint8)


def unpack(packed: np.ndarray) -> np.ndarray:
    return np.stack([packed & 15, packed >> 4], axis=-1).reshape(packed.shape[:-1] + (-1,))


def modelopt_names(n: str) -> tuple:
    """(codes, scale, global scale) names ModelOpt 0.47.0's export gives quantized parameter ``n``: X.weight,
    X.weight_scale, X.weight_scale_2; a parameter P not named weight keeps its codes in P (setattr(module, P, ...))
    and its scales take the prefix P_ (quantizer_attr_names): P, P_weight_scale, P_weight_scale_2."""
    if n.endswith(".weight"):
        return n, n + "_scale", n + "_scale_2"
    return n, n + "_weight_scale", n + "_weight_scale_2"


# ----------------------------------------------------------------------------------------------- ModelOpt layout


def test_modelopt_layout_names_configs_and_index(src, modelopt_out):
    root, tensors = src
    files = sorted(p.name for p in modelopt_out.iterdir())
    assert files == sorted(["config.json", "hf_quant_config.json", "model.safetensors.index.json", SHARD1, SHARD2,
                            "tokenizer.json"])
    assert (modelopt_out / "tokenizer.json").read_text() == '{"version": "1.0"}'
    hf = json.loads((modelopt_out / "hf_quant_config.json").read_text())
    assert hf["quantization"] == {"quant_algo": "W4A16_NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                                  "exclude_modules": ["lm_head", "model.embed_tokens", "model.layers.0.mlp.down_proj",
                                                      "model.layers.1.mlp.gate"]}
    cfg = json.loads((modelopt_out / "config.json").read_text())
    assert cfg["torch_dtype"] == "bfloat16" and cfg["architectures"] == ["LlamaForCausalLM"]
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "modelopt" and qc["quant_algo"] == "W4A16_NVFP4"
    assert qc["config_groups"]["group_0"]["weights"]["group_size"] == 16 and "input_activations" not in \
        qc["config_groups"]["group_0"]
    q = raw(modelopt_out)
    index = json.loads((modelopt_out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {n: v[2] for n, v in q.items()}
    assert index["metadata"]["total_size"] == sum(len(v[3]) for v in q.values())
    assert not any(n.endswith("input_scale") for n in q)  # weight-only: no activation calibration, no input_scale
    for n in IGNORED:
        assert q[n][0] == "BF16" and q[n][3] == tensors[n].tobytes()
    assert q[DOWN72][3] == tensors[DOWN72].tobytes()  # K=72: not a multiple of 16, kept in bf16
    for n, x in tensors.items():
        if n in IGNORED or n == DOWN72:
            continue
        codes, scale, g = (q[m] for m in modelopt_names(n))
        lead, k = x.shape[:-1], x.shape[-1]
        assert (codes[0], codes[1]) == ("U8", lead + (k // 2,)), n
        assert (scale[0], scale[1]) == ("F8_E4M3", lead + (k // 16,)), n
        assert (g[0], g[1]) == ("F32", (x.shape[0],) if x.ndim == 3 else ()), n
        assert codes[2] == scale[2] == g[2] == (SHARD1 if "layers.0" in n or "embed" in n else SHARD2)


def test_modelopt_bytes_follow_modelopt_arithmetic(src, modelopt_out):
    """Global scale = fused group's amax / 2688 (per expert for 3-D); block scale = e4m3(clamp(a / (6 sf2), 2^-9,
    448)); codes = e2m1(x / (s sf2)), each fp32 step as ModelOpt's NVFP4QTensor.quantize."""
    _, tensors = src
    q = raw(modelopt_out)
    checked = 0
    for n, x in tensors.items():
        if n in IGNORED or n == DOWN72:
            continue
        cn, sn, gn = modelopt_names(n)
        packed = np.frombuffer(q[cn][3], np.uint8).reshape(q[cn][1])
        sbytes = np.frombuffer(q[sn][3], np.uint8).reshape(q[sn][1])
        g = np.frombuffer(q[gn][3], np.float32)
        experts = [f32(x)] if x.ndim == 2 else [f32(x[e]) for e in range(x.shape[0])]
        for e, xe in enumerate(experts):
            a = max(amax(tensors[m]) for m in group_of(n)) if x.ndim == 2 else amax(xe)
            sf2 = np.float32(a / np.float32(2688.0))
            assert g[e] == sf2, (n, e)
            k = xe.shape[-1]
            kp = -(-k // 16) * 16
            xp = np.zeros((xe.shape[0], kp), np.float32)
            xp[:, :k] = xe
            blocks = xp.reshape(xe.shape[0], -1, 16)
            p = np.max(np.abs(blocks), axis=-1) / np.float32(np.float32(6.0) * sf2)
            p = np.where(p == 0, np.float32(1.0), p)
            s = np.clip(p, np.float32(2.0 ** -9), np.float32(448.0)).astype(ml_dtypes.float8_e4m3fn)
            sb = sbytes if x.ndim == 2 else sbytes[e]
            np.testing.assert_array_equal(sb, s.view(np.uint8), err_msg=n)
            quot = blocks / (s.astype(np.float32)[..., None] * sf2)
            cb = packed if x.ndim == 2 else packed[e]
            np.testing.assert_array_equal(unpack(cb).reshape(quot.shape), e2m1_rne(quot), err_msg=n)
            if kp != k:
                assert not np.any(unpack(cb)[:, k:]), "padding codes are zero"
            checked += 1
    assert checked == 4 + 2 + 3 * 4 + 2 * 4  # q k v o, gate up (layer 0), 12 experts, 2 3-D tensors x 4
    g = {n: np.frombuffer(q[n[: -len("weight")] + "weight_scale_2"][3], np.float32)[0] for n in QKV + GATE_UP}
    assert g[QKV[0]] == g[QKV[1]] == g[QKV[2]] and g[GATE_UP[0]] == g[GATE_UP[1]]
    g3 = np.frombuffer(q[modelopt_names(EXPERTS_3D[0])[2]][3], np.float32)
    assert len(set(g3.tolist())) == 4  # one global scale per expert
    meta = safe_open(str(modelopt_out / SHARD1), framework="np").metadata()
    assert json.loads(meta["fp4ref.tensors"])[QKV[1]] == {"shape": [32, 64], "dtype": "BF16"}
    assert meta["format"] == "pt" and meta["fp4ref.checkpoint_format"] == "modelopt"


def test_jobs_give_identical_bytes(src, modelopt_out, tmp_path):
    out = tmp_path / "j2"
    assert main([str(src[0] / "model.safetensors.index.json"), "-o", str(out), "--checkpoint-format", "modelopt",
                 "--jobs", "2", "--quiet"]) == 0
    for f in sorted(modelopt_out.iterdir()):
        assert (out / f.name).read_bytes() == f.read_bytes(), f.name
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in modelopt_out.iterdir())


# ----------------------------------------------------------------------------------------- compressed-tensors


def test_compressed_tensors_nvfp4(src, tmp_path):
    root, tensors = src
    out = tmp_path / "ct"
    reports = {r.name: r for r in C.quantize_checkpoint(root, out, checkpoint_format="compressed-tensors", jobs=2)}
    q = raw(out)
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "nvfp4-pack-quantized"
    assert qc["quantization_status"] == "compressed"
    w = qc["config_groups"]["group_0"]["weights"]
    assert (w["num_bits"], w["type"], w["strategy"], w["group_size"]) == (4, "float", "tensor_group", 16)
    assert qc["config_groups"]["group_0"]["input_activations"] is None
    # K=72 (down_proj) is not a multiple of 16: kept in bf16 and listed in ignore, as the router and lm_head
    assert reports["model.layers.0.mlp.down_proj.weight"].action == "copied"
    assert "model.layers.0.mlp.down_proj" in qc["ignore"] and "lm_head" in qc["ignore"]
    assert reports[EXPERTS_3D[0]].action == "copied"
    for n in QKV + GATE_UP + ["model.layers.1.mlp.experts.3.up_proj.weight"]:
        base = n[: -len("weight")]
        assert set(k for k in q if k.startswith(base)) == {base + s for s in ("weight_packed", "weight_scale",
                                                                              "weight_global_scale")}
        x = f32(tensors[n])
        gs = q[base + "weight_global_scale"]
        assert (gs[0], gs[1]) == ("F32", (1,))
        enc = np.frombuffer(gs[3], np.float32)[0]
        a = max(amax(tensors[m]) for m in group_of(n))
        assert enc == np.float32(np.float32(2688.0) / a)  # the encode direction (inverse of ModelOpt's)
        assert q[base + "weight_packed"][:2] == ("U8", (x.shape[0], x.shape[1] // 2))
        assert q[base + "weight_scale"][:2] == ("F8_E4M3", (x.shape[0], x.shape[1] // 16))
        # values: decoded by hand with decode scale 1/enc, within one E2M1 half-step of x per block
        vals = E2M1[unpack(np.frombuffer(q[base + "weight_packed"][3], np.uint8).reshape(x.shape[0], -1))]
        s = np.frombuffer(q[base + "weight_scale"][3], ml_dtypes.float8_e4m3fn).astype(np.float64)
        dec = (vals.reshape(x.shape[0], -1, 16) * s.reshape(x.shape[0], -1, 1)) / np.float64(enc)
        err = np.abs(dec.reshape(x.shape) - x)
        assert np.all(err <= np.repeat(s, 16).reshape(x.shape) / enc + 1e-12), n
        assert reports[n].sqnr_db > 18
        # bytes: the layout's recipe (te; test_each_layout_quantizes_with_its_documented_default tells it apart)
        # on the tensor with the fused group's amax
        from fp4ref import nvfp4_quantize

        t = nvfp4_quantize(x, recipe="te", global_amax=a)
        assert q[base + "weight_packed"][3] == t.codes.tobytes() and q[base + "weight_scale"][3] == t.scales.tobytes()


@pytest.mark.parametrize("recipe,e4m3_max", [("te-4over6", 448), ("te-4over6-mse", 448), ("te-4over6-256", 256),
                                             ("te-4over6-mse-256", 256)])
def test_compressed_tensors_stores_the_4over6_recipes_encode_scale(tmp_path, recipe, e4m3_max):
    """The TE 4/6 recipes have a global encode scale 6 * E4M3max / amax (2688 or 1536) whose fp32 reciprocal is
    their decode scale, so compressed-tensors (which keeps the encode scale) stores them: weight_global_scale is
    fp32(6 * E4M3max / amax), codes and scales are nvfp4_quantize's, audit --reference agrees."""
    from safetensors.numpy import save_file

    from fp4ref import nvfp4_quantize
    from fp4ref.audit import audit_checkpoint

    x = (np.random.default_rng(3).standard_normal((32, 64)) * 5).astype(np.float32)
    f = tmp_path / "w.safetensors"
    save_file({"layer.weight": x}, str(f))
    out = tmp_path / "ct"
    C.quantize_checkpoint(f, out, checkpoint_format="compressed-tensors", recipe=recipe)
    q, want = raw(out), nvfp4_quantize(x, recipe=recipe)
    enc = np.frombuffer(q["layer.weight_global_scale"][3], np.float32)[0]
    assert enc == np.float32(6 * e4m3_max) / np.abs(x).max() and np.float32(1) / enc == want.global_decode_scale
    assert q["layer.weight_packed"][3] == want.codes.tobytes() and q["layer.weight_scale"][3] == want.scales.tobytes()
    assert audit_checkpoint(out, reference=f, recipe=recipe).clean


def test_mx_layouts(src, tmp_path):
    root, tensors = src
    n = "model.layers.0.self_attn.o_proj.weight"
    x = f32(tensors[n])
    out = tmp_path / "mo8"
    C.quantize_checkpoint(root, out, fmt="mxfp8", checkpoint_format="modelopt")
    q = raw(out)
    assert json.loads((out / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == "MXFP8"
    assert q[n][:2] == ("F8_E4M3", (64, 64)) and q[n[:-6] + "weight_scale"][:2] == ("U8", (64, 2))
    sb = np.frombuffer(q[n[:-6] + "weight_scale"][3], np.uint8).reshape(64, 2).astype(np.int64)
    a = np.max(np.abs(x.reshape(64, 2, 32)), axis=-1)
    # ModelOpt MXFP8QTensor: 2^ceil(log2(amax / 448)) (rceil); the elements then fit E4M3 without saturation
    want = np.ceil(np.log2((a / np.float32(448.0)).astype(np.float64))).astype(np.int64) + 127
    np.testing.assert_array_equal(sb, want)
    vals = np.frombuffer(q[n][3], ml_dtypes.float8_e4m3fn).astype(np.float64).reshape(64, 2, 32)
    dec = (vals * np.ldexp(1.0, sb - 127)[..., None]).reshape(64, 64)
    assert np.all(np.abs(dec - x) <= np.abs(x) * 2.0 ** -4 + np.ldexp(1.0, np.repeat(sb - 127 - 9, 32, axis=1)))
    out = tmp_path / "ct4"
    C.quantize_checkpoint(root, out, fmt="mxfp4", checkpoint_format="compressed-tensors")
    q = raw(out)
    assert json.loads((out / "config.json").read_text())["quantization_config"]["format"] == "mxfp4-pack-quantized"
    assert q[n[:-6] + "weight_packed"][:2] == ("U8", (64, 32)) and q[n[:-6] + "weight_scale"][:2] == ("U8", (64, 2))
    assert n[:-6] + "weight_global_scale" not in q
    with pytest.raises(C.QuantizeFileError, match="W4A8_MXFP4_FP8"):
        C.quantize_checkpoint(root, tmp_path / "x", fmt="mxfp4", checkpoint_format="modelopt")


def test_module_names_with_pattern_characters_in_the_exclude_lists(tmp_path):
    """ModelOpt's exclude_modules entries are patterns: an unquantized module named "l*" or "x[y]" would exclude
    "l1" / "xy" too, so the modelopt layout refuses it (naming it); compressed-tensors compares a plain ignore entry
    with the module name exactly, so it writes the names and its audit is clean."""
    from safetensors.numpy import save_file

    from fp4ref.audit import audit_checkpoint

    rng = np.random.default_rng(0)
    f = tmp_path / "br.safetensors"
    save_file({n: rng.standard_normal((4, 32)).astype(np.float32)
               for n in ("x[y].weight", "xy.weight", "l*.weight", "l1.weight")}, str(f))
    with pytest.raises(C.QuantizeFileError, match=r"module 'l\*' stays unquantized \(ignored \(\\\*\)\) but its name "
                                                  r"holds a pattern .*names modules exactly\), or quantize it too"):
        C.quantize_checkpoint(f, tmp_path / "mo", checkpoint_format="modelopt", ignore=[r"\[y\]", r"\*"])
    assert not (tmp_path / "mo").exists()
    # a weight its shape keeps unquantized: the message says why, and does not suggest quantizing it
    g = tmp_path / "k33.safetensors"
    save_file({"m[0].weight": np.ones((4, 33), np.float32), "q.weight": np.ones((4, 32), np.float32)}, str(g))
    with pytest.raises(C.QuantizeFileError, match=r"module 'm\[0\]' stays unquantized \(K=33 is not a positive "
                                                  r"multiple of 16\) but .*names modules exactly\)$"):
        C.quantize_checkpoint(g, tmp_path / "mo", checkpoint_format="modelopt")
    C.quantize_checkpoint(f, tmp_path / "ct", checkpoint_format="compressed-tensors", ignore=[r"\[y\]", r"\*"])
    assert json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]["ignore"] == ["l*", "x[y]"]
    assert audit_checkpoint(tmp_path / "ct").clean


# (layout, format) -> (expected block-1 scale byte, the default recipe or mode it shows), on the inputs below
_DEFAULT_BYTES = {
    ("fp4ref", "nvfp4"): (121, "te"), ("modelopt", "nvfp4"): (120, "modelopt"),
    ("compressed-tensors", "nvfp4"): (121, "te"),
    ("fp4ref", "mxfp4"): (127, "floor"), ("compressed-tensors", "mxfp4"): (127, "floor"),
    ("fp4ref", "mxfp8"): (121, "floor"), ("compressed-tensors", "mxfp8"): (121, "floor"),
    ("modelopt", "mxfp8"): (122, "rceil"),
}


@pytest.mark.parametrize("layout, fmt", list(_DEFAULT_BYTES))
def test_each_layout_quantizes_with_its_documented_default(tmp_path, layout, fmt):
    """The default recipe / mode of each layout, told apart by a block whose scale byte differs between them.
    NVFP4: block 0 holds the tensor amax 138.84 (0x430AD652), block 1's amax is 84.29401 (0x42A89688): TE >= 2.14
    computes 84.29401 * (S_enc * fp32(1/6)) = 272.00003 -> E4M3 288 (0x79 = 121), the workload's "sol" order
    (84.29401 / 6) * S_enc = 272.0, a tie -> 256 (0x78 = 120), as ModelOpt's a / (6 sf2) does. MX: block 1's amax
    7.9 gives the UE8M0 byte floor(log2 7.9) - emax + 127 = 2 - 2 + 127 = 127 (E2M1) or 2 - 8 + 127 = 121 (E4M3)
    under floor; ceil, even and rceil give one more (ModelOpt's MXFP8: ceil(log2(7.9 / 448)) + 127 = 122)."""
    from safetensors.numpy import save_file

    want, _ = _DEFAULT_BYTES[(layout, fmt)]
    if fmt == "nvfp4":
        x = np.zeros((1, 32), np.float32)
        x[0, 0], x[0, 16] = np.array([0x430AD652, 0x42A89688], np.uint32).view(np.float32)
    else:
        x = np.linspace(-1.0, 1.0, 64, dtype=np.float32).reshape(1, 64)  # block 0: amax 1
        x[0, 32 + 5] = 7.9
    f = tmp_path / "w.safetensors"
    save_file({"layer.weight": x}, str(f))
    rep, = C.quantize_checkpoint(f, tmp_path / "out", fmt=fmt, checkpoint_format=layout)
    assert rep.action == "quantized"
    q = raw(tmp_path / "out")
    scale = next(v for n, v in q.items() if n.endswith("weight_scale") or n == "layer.weight_scale")
    assert np.frombuffer(scale[3], np.uint8)[1] == want, (layout, fmt, np.frombuffer(scale[3], np.uint8))


@pytest.mark.parametrize("recipe", ["torchao-single-level", "torchao-0.16-single-level"])
def test_single_level_recipes_quantize_a_checkpoint_as_nvfp4_quantize_does(tmp_path, recipe):
    """The single-level recipes have block scales only: the checkpoint layer passes them no global amax (it did, and
    nvfp4_quantize refused it), and the bytes are nvfp4_quantize's on the whole tensor; audit agrees."""
    from safetensors.numpy import save_file

    from fp4ref import nvfp4_quantize
    from fp4ref.audit import audit_checkpoint

    x = (np.random.default_rng(5).standard_normal((40, 64)) * 3).astype(np.float32)
    f = tmp_path / "w.safetensors"
    save_file({"layer.weight": x}, str(f))
    out = tmp_path / "mo"
    rep, = C.quantize_checkpoint(f, out, checkpoint_format="modelopt", recipe=recipe)
    assert rep.action == "quantized" and rep.sqnr_db > 15
    q, want = raw(out), nvfp4_quantize(x, recipe=recipe)
    assert q["layer.weight"][3] == want.codes.tobytes() and q["layer.weight_scale"][3] == want.scales.tobytes()
    assert np.frombuffer(q["layer.weight_scale_2"][3], np.float32)[0] == want.global_decode_scale == 1.0
    assert audit_checkpoint(out, reference=f, recipe=recipe).clean
    assert main([str(f), "-o", str(tmp_path / "fp.safetensors"), "--recipe", recipe, "--quiet"]) == 0


def test_fused_3d_expert_tensors_share_one_global_scale_per_expert(tmp_path):
    """gate_proj / up_proj stored as 3-D [experts, N, K] tensors form a fused group: expert e of both gets the
    global scale of max(amax(gate[e]), amax(up[e])) (each expert's own, not expert 0's for all: that crashed), so
    each expert decodes as nvfp4_quantize with that global amax; members of different expert counts are refused."""
    from safetensors.numpy import save_file

    from fp4ref import nvfp4_dequantize, nvfp4_quantize
    from fp4ref.audit import audit_checkpoint

    rng = np.random.default_rng(9)
    pre = "model.layers.0.mlp.experts."
    g = (rng.standard_normal((4, 32, 64)) * np.array([1, 2, 3, 4])[:, None, None]).astype(np.float32)
    u = (rng.standard_normal((4, 32, 64)) * np.array([4, 1, 1, 0.5])[:, None, None]).astype(np.float32)
    root = tmp_path / "m"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"architectures": ["MixtralForCausalLM"]}))
    save_file({pre + "gate_proj.weight": g, pre + "up_proj.weight": u}, str(root / "model.safetensors"))
    for cf, recipe in (("fp4ref", "te"), ("modelopt", "modelopt")):
        out = tmp_path / cf
        C.quantize_checkpoint(root, out, checkpoint_format=cf)
        for name, x in (("gate_proj", g), ("up_proj", u)):
            got = C.read_dequantized(out, pre + name + ".weight")
            for e in range(4):
                amax = float(max(np.abs(g[e]).max(), np.abs(u[e]).max()))
                want = nvfp4_dequantize(nvfp4_quantize(x[e], recipe=recipe, global_amax=amax), dtype=np.float64)
                np.testing.assert_array_equal(got[e], want, err_msg=f"{cf} {name} expert {e}")
        assert audit_checkpoint(out, reference=root).clean
    save_file({pre + "gate_proj.weight": g, pre + "up_proj.weight": u[:2]}, str(root / "model.safetensors"))
    with pytest.raises(C.QuantizeFileError, match=r"^fused layer model\.layers\.0\.mlp\.experts\.gate_up: its "
                                                  r"members share one global scale per expert but hold different "
                                                  r"expert counts \(.*up_proj.weight \(2 expert\(s\)\), .*gate_proj"):
        C.quantize_checkpoint(root, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def _write_raw(path: Path, tensors: dict, metadata: dict) -> None:
    """A safetensors file of raw tensors {name: (dtype string, shape, bytes)}, in name order."""
    header, data = {"__metadata__": metadata}, b""
    for n in sorted(tensors):
        dt, shape, b = tensors[n]
        header[n] = {"dtype": dt, "shape": list(shape), "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    h = json.dumps(header).encode()
    path.write_bytes(len(h).to_bytes(8, "little") + h + data)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_modelopt_3d_parameter_keeps_its_name_for_the_codes(tmp_path, capsys, fmt):
    """ModelOpt's export writes a quantized parameter P that is not named weight as P (the codes, setattr on the
    parameter's own name), P_weight_scale and P_weight_scale_2; a .weight tensor keeps X.weight, X.weight_scale,
    X.weight_scale_2. --dequantize, read_dequantized and audit read the codes back from P, bit for bit, and drop a
    ModelOpt P_input_scale."""
    from safetensors.numpy import save_file

    from fp4ref.audit import audit_checkpoint

    rng = np.random.default_rng(5)
    P, W = "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj.weight"
    x = {P: rng.standard_normal((2, 64, 32)).astype(np.float32),
         W: (rng.standard_normal((2, 32, 64)) * 3).astype(np.float32)}
    src = tmp_path / "m.safetensors"
    save_file(x, str(src))
    out = tmp_path / "mo"
    assert main([str(src), "-o", str(out) + "/", "--checkpoint-format", "modelopt", "--format", fmt, "--quiet"]) == 0
    q = raw(out)
    if fmt == "nvfp4":
        want = {P: ("U8", (2, 64, 16)), P + "_weight_scale": ("F8_E4M3", (2, 64, 2)),
                P + "_weight_scale_2": ("F32", (2,)),
                W: ("U8", (2, 32, 32)), W + "_scale": ("F8_E4M3", (2, 32, 4)), W + "_scale_2": ("F32", (2,))}
    else:
        want = {P: ("F8_E4M3", (2, 64, 32)), P + "_weight_scale": ("U8", (2, 64, 1)),
                W: ("F8_E4M3", (2, 32, 64)), W + "_scale": ("U8", (2, 32, 2))}
    assert {n: v[:2] for n, v in q.items()} == want
    assert json.loads((out / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"] == []

    def exact(n, scale_name, global_name):
        """The stored codes decoded by hand: E2M1 table (or E4M3 via ml_dtypes) x block scale x global scale."""
        lead = q[n][1][:-1]
        if fmt == "nvfp4":
            vals = E2M1[unpack(np.frombuffer(q[n][3], np.uint8).reshape(q[n][1]))]
            s = np.frombuffer(q[scale_name][3], ml_dtypes.float8_e4m3fn).astype(np.float64).reshape(lead + (-1, 1))
            g = np.frombuffer(q[global_name][3], np.float32).astype(np.float64).reshape(-1, 1, 1, 1)
            return (vals.reshape(lead + (-1, 16)) * s * g).reshape(x[n].shape)
        vals = np.frombuffer(q[n][3], ml_dtypes.float8_e4m3fn).astype(np.float64)
        sb = np.frombuffer(q[scale_name][3], np.uint8).astype(np.int64).reshape(lead + (-1, 1))
        return (vals.reshape(lead + (-1, 32)) * np.ldexp(1.0, sb - 127)).reshape(x[n].shape)

    exp = {P: exact(P, P + "_weight_scale", P + "_weight_scale_2"), W: exact(W, W + "_scale", W + "_scale_2")}
    for n in (P, W):
        assert 20 < 10 * np.log10(np.sum(x[n].astype(np.float64) ** 2) / np.sum((x[n] - exp[n]) ** 2)), n
        np.testing.assert_array_equal(C.read_dequantized(out, n), exp[n], err_msg=n)
    rep = audit_checkpoint(out, reference=src)
    assert rep.clean and {t.name: (t.shape, t.reference) for t in rep.tensors} == {
        P: ([2, 64, 32], "equal"), W: ([2, 32, 64], "equal")}
    # a ModelOpt checkpoint with activation scales: P_input_scale / X.input_scale are dropped, not restored
    meta = safe_open(str(out / "m.safetensors"), framework="np").metadata()
    one = np.float32(0.5).tobytes()
    _write_raw(out / "m.safetensors", {**{n: v[:2] + (v[3],) for n, v in q.items()},
                                       P + "_input_scale": ("F32", (), one),
                                       W[: -len("weight")] + "input_scale": ("F32", (), one)}, meta)
    back = tmp_path / "back"
    assert main([str(out), "-o", str(back), "--dequantize", "--quiet"]) == 0
    got = load_file(str(back / "m.safetensors"))
    assert sorted(got) == [W, P]
    for n in (P, W):
        assert got[n].dtype == np.float32
        np.testing.assert_array_equal(got[n], exp[n].astype(np.float32), err_msg=n)  # one rounding of the exact
    capsys.readouterr()


def test_tensors_kept_unquantized_beside_scale_like_names_read_back(tmp_path, capsys):
    """An input holding a.weight beside its own a.weight_scale collides with the ModelOpt names; quantize's advice is
    to keep a.weight unquantized with --ignore. The output then holds a.weight (F32) and a.weight_scale (F32) as
    they came: audit and --dequantize must take the layers the output records (fp4ref.tensors), not every
    *weight_scale name (audit refused a.weight as "expected U8", dequantize asked for its original dtype)."""
    from safetensors.numpy import save_file

    from fp4ref.audit import audit_checkpoint

    rng = np.random.default_rng(9)
    x = {"a.weight": rng.standard_normal((48, 64)).astype(np.float32),
         "a.weight_scale": rng.standard_normal((48, 4)).astype(np.float32),
         "b.weight": rng.standard_normal((32, 64)).astype(np.float32)}
    src = tmp_path / "m.safetensors"
    save_file(x, str(src))
    out = tmp_path / "mo"
    assert main([str(src), "-o", str(out) + "/", "--checkpoint-format", "modelopt", "--ignore", r"^a\.",
                 "--quiet"]) == 0
    q = raw(out)
    assert q["a.weight"][:2] == ("F32", (48, 64)) and q["a.weight_scale"][:2] == ("F32", (48, 4))
    assert q["b.weight"][:2] == ("U8", (32, 32))
    rep = audit_checkpoint(out, reference=src)
    assert rep.clean and [(t.name, t.shape, t.reference) for t in rep.tensors] == [("b.weight", [32, 64], "equal")]
    back = tmp_path / "back"
    assert main([str(out), "-o", str(back), "--dequantize", "--quiet"]) == 0
    got = load_file(str(back / "m.safetensors"))
    assert sorted(got) == sorted(x)
    for n in ("a.weight", "a.weight_scale"):  # copied through untouched
        np.testing.assert_array_equal(got[n], x[n], err_msg=n)
    np.testing.assert_array_equal(got["b.weight"], C.read_dequantized(out, "b.weight").astype(np.float32))
    capsys.readouterr()


# ------------------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("cf,fmt", [("modelopt", "nvfp4"), ("compressed-tensors", "nvfp4"), ("fp4ref", "mxfp4")])
def test_round_trip_through_fp4refs_reader(src, tmp_path, cf, fmt):
    root, tensors = src
    qdir, ddir = tmp_path / "q", tmp_path / "d"
    C.quantize_checkpoint(root, qdir, checkpoint_format=cf, fmt=fmt)
    assert main([str(qdir), "-o", str(ddir), "--dequantize", "--quiet", "--jobs", "2"]) == 0
    back = {}
    for f in (SHARD1, SHARD2):
        back.update(load_file(str(ddir / f)))
    assert sorted(back) == sorted(tensors)
    index = json.loads((ddir / "model.safetensors.index.json").read_text())
    assert sorted(index["weight_map"]) == sorted(tensors)
    assert "quantization_config" not in json.loads((ddir / "config.json").read_text())
    assert not (ddir / "hf_quant_config.json").exists()
    q = raw(qdir)
    n = QKV[1]
    x = tensors[n]
    base = n[: -len("weight")]
    if fmt == "nvfp4":
        codes = q[base + ("weight" if cf == "modelopt" else "weight_packed")]
        s = np.frombuffer(q[base + "weight_scale"][3], ml_dtypes.float8_e4m3fn).astype(np.float64)
        if cf == "modelopt":
            g = float(np.frombuffer(q[base + "weight_scale_2"][3], np.float32)[0])
        else:
            g = float(np.float32(1.0) / np.frombuffer(q[base + "weight_global_scale"][3], np.float32)[0])
        vals = E2M1[unpack(np.frombuffer(codes[3], np.uint8).reshape(x.shape[0], -1))]
        exact = (vals.reshape(x.shape[0], -1, 16) * s.reshape(x.shape[0], -1, 1) * g).reshape(x.shape)
    else:
        vals = E2M1[unpack(np.frombuffer(q[n][3], np.uint8).reshape(x.shape[0], -1))]
        sb = np.frombuffer(q[n + "_scale"][3], np.uint8).reshape(x.shape[0], -1).astype(np.int64)
        exact = (vals.reshape(x.shape[0], -1, 32) * np.ldexp(1.0, sb - 127)[..., None]).reshape(x.shape)
    assert back[n].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(back[n], exact.astype(ml_dtypes.bfloat16))  # one rounding of the exact value
    np.testing.assert_array_equal(C.read_dequantized(qdir, n), exact)
    for m in IGNORED if cf != "fp4ref" else ["model.norm.weight"]:  # fp4ref's layout has no default ignores
        assert back[m].tobytes() == tensors[m].tobytes()
    if cf == "modelopt":  # 3-D experts and the padded K come back in their shapes
        assert back[EXPERTS_3D[0]].shape == tensors[EXPERTS_3D[0]].shape
    d32 = tmp_path / "d32"
    C.dequantize_checkpoint(qdir, d32, dtype="float32")
    back32 = {}
    for f in (SHARD1, SHARD2):
        back32.update(load_file(str(d32 / f)))
    assert back32[n].dtype == np.float32
    assert json.loads((d32 / "config.json").read_text())["torch_dtype"] == "float32"
    for m in IGNORED if cf != "fp4ref" else ["model.norm.weight"]:  # --dtype converts only dequantized tensors
        assert back32[m].dtype == tensors[m].dtype and back32[m].tobytes() == tensors[m].tobytes()


def test_round_to_is_one_rounding():
    x = np.array([1 + 2.0 ** -8 + 2.0 ** -30, 1 + 2.0 ** -11 + 2.0 ** -40])  # float32 first would tie, then round down
    assert float(C.round_to(x[:1], "BF16")[0]) == 1 + 2.0 ** -7
    assert float(C.round_to(x[1:], "F16")[0]) == 1 + 2.0 ** -10
    with pytest.raises(ValueError, match="overflows F16"):
        C.round_to(np.array([1e6]), "F16", "w")


# ------------------------------------------------------------------------------------------------------- safety


def _listing(d: Path) -> list:
    return sorted(p.name for p in d.iterdir())


def test_existing_output_needs_force_and_nothing_partial_remains(src, tmp_path, capsys):
    root, _ = src
    out = tmp_path / "o"
    argv = [str(root), "-o", str(out), "--checkpoint-format", "modelopt", "--quiet"]
    assert main(argv) == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(argv) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(argv + ["--force"]) == 0  # a previous output of the same checkpoint is replaced
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first
    assert _listing(tmp_path) == ["o"]  # no temporary directory left


def test_an_output_inside_the_input_directory_is_refused(src, modelopt_out, capsys):
    """The input model directory is never modified: an output path inside it (with or without --force, quantize
    or --dequantize) is refused and nothing appears there."""
    root, _ = src
    for inp, out, extra in ((root, root / "q", []), (root, root / "q", ["--force"]),
                            (root, root / "sub" / ".." / "q2", ["--checkpoint-format", "fp4ref"]),
                            (modelopt_out, modelopt_out / "d", ["--dequantize"])):
        before = _listing(inp)
        assert main([str(inp), "-o", str(out), "--quiet"] + extra) == 2, out
        err = capsys.readouterr().err
        assert "is inside the input directory" in err, err
        assert _listing(inp) == before
    before = _listing(root)
    # a lone shard given as a file: its output may go beside it (the usual model.nvfp4.safetensors), not refused
    assert "inside the input directory" not in str(
        _output_error(root / SHARD1, root / "lone.nvfp4.safetensors", capsys))
    (root / "lone.nvfp4.safetensors").unlink()
    assert _listing(root) == before


def _output_error(inp, out, capsys) -> str:
    main([str(inp), "-o", str(out), "--quiet", "--checkpoint-format", "fp4ref"])
    return capsys.readouterr().err


def test_an_output_of_the_wrong_kind_is_named_before_force(src, tmp_path, capsys):
    """A directory where the output file goes (or a file where the output directory goes) is refused with that
    reason, with or without --force: the message says what is there and why --force does not apply, never a
    "pass --force" hint that would only lead to it."""
    root, _ = src
    (tmp_path / "o.safetensors").mkdir()
    (tmp_path / "o").write_text("a user's file")
    for argv, there, want in (([str(root / SHARD1), "-o", str(tmp_path / "o.safetensors")], "directory", "file"),
                              ([str(root), "-o", str(tmp_path / "o")], "file", "directory")):
        for force in ([], ["--force"]):
            assert main(argv + ["--quiet"] + force) == 2
            err = capsys.readouterr().err
            assert f"is a {there}; expected a {want}" in err and "pass --force" not in err, err
            assert f"--force does not apply: it replaces an output of the same kind only, never a {there} with a " \
                   f"{want}; remove it or choose another output path" in err, err
    assert (tmp_path / "o").read_text() == "a user's file" and not any((tmp_path / "o.safetensors").iterdir())


def test_force_never_deletes_files_the_output_does_not_replace(src, tmp_path, capsys):
    """--force into a directory holding a user's files (or subdirectories) is refused, the files stay."""
    root, _ = src
    out = tmp_path / "o"
    out.mkdir()
    (out / "thesis.txt").write_text("mine")
    argv = [str(root), "-o", str(out), "--checkpoint-format", "modelopt", "--quiet", "--force"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "'thesis.txt'" in err and "does not replace" in err and err.count("\n") == 1
    assert "remove it or choose" in err  # one file: "it"
    assert _listing(out) == ["thesis.txt"] and (out / "thesis.txt").read_text() == "mine"
    assert _listing(tmp_path) == ["o"]
    (out / "sub").mkdir()
    assert main(argv) == 2  # refused before any work
    assert "subdirectories ('sub')" in capsys.readouterr().err
    (out / "notes.txt").write_text("also mine")
    (out / "sub").rmdir()
    assert main(argv) == 2
    assert "'notes.txt', 'thesis.txt'" in (err := capsys.readouterr().err) and "remove them or choose" in err
    (out / "notes.txt").unlink()
    (out / "sub").mkdir()
    assert _listing(out) == ["sub", "thesis.txt"] and _listing(tmp_path) == ["o"]


class _NoWork:
    """Stands in for checkpoint.Workers: any pass that starts fails the test."""

    def __init__(self, *args):
        raise AssertionError("the quantizer started work")


def test_files_the_output_would_not_replace_are_refused_before_any_work(src, modelopt_out, tmp_path, capsys,
                                                                       monkeypatch):
    """The output's file names are known from the plan, so a directory holding others is refused before the amax
    pass (and reported by --dry-run, which the real run would hit with or without --force)."""
    root, _ = src
    out = tmp_path / "o"
    out.mkdir()
    (out / "thesis.txt").write_text("mine")
    monkeypatch.setattr(C, "Workers", _NoWork)
    for fmt in C.CHECKPOINT_FORMATS:
        with pytest.raises(C.CheckpointError, match=r"'thesis.txt'.*does not replace"):
            C.quantize_checkpoint(root, out, checkpoint_format=fmt, force=True)
        for force in ([], ["--force"]):
            assert main([str(root), "-o", str(out), "--checkpoint-format", fmt, "--dry-run"] + force) == 2
            err = capsys.readouterr().err
            assert "'thesis.txt'" in err and "does not replace" in err, err
    with pytest.raises(C.CheckpointError, match=r"'thesis.txt'.*does not replace"):
        C.dequantize_checkpoint(modelopt_out, out, force=True)
    assert _listing(out) == ["thesis.txt"] and (out / "thesis.txt").read_text() == "mine"


@pytest.mark.parametrize("fmt", C.CHECKPOINT_FORMATS)
def test_the_names_checked_ahead_are_the_names_written(src, tmp_path, fmt):
    """``_output_names`` (the early check) lists exactly what quantize and dequantize write, for a model directory
    and for a lone shard (no config.json), so a previous output is always replaceable with --force."""
    root, _ = src
    for inp in (root, root / SHARD1):
        out = tmp_path / f"q-{inp.stem}"
        C.quantize_checkpoint(inp, out, checkpoint_format=fmt)
        ckpt = C.open_checkpoint(inp)
        assert set(_listing(out)) == C._output_names(ckpt, C.resolve_target(fmt), quantized=True), (fmt, inp)
        C.quantize_checkpoint(inp, out, checkpoint_format=fmt, force=True)  # replaceable
        back = tmp_path / f"d-{inp.stem}"
        C.dequantize_checkpoint(out, back)
        assert set(_listing(back)) == C._output_names(C.open_checkpoint(out), None, quantized=False), (fmt, inp)
        C.dequantize_checkpoint(out, back, force=True)


def test_jobs_are_capped_by_cpus_and_tensors(src, tmp_path):
    with C.Workers(10_000, 3) as pool:
        assert pool.jobs == min(3, os.cpu_count() or 1)
    with C.Workers(5, 1) as pool:
        assert pool.jobs == 1 and pool.ex is None
    root, _ = src
    assert main([str(root), "-o", str(tmp_path / "a"), "--quiet", "--jobs", "100000"]) == 0
    assert main([str(root), "-o", str(tmp_path / "b"), "--quiet"]) == 0
    assert raw(tmp_path / "a") == raw(tmp_path / "b")


def test_write_error_is_one_line_and_leaves_nothing(src, tmp_path, capsys, monkeypatch):
    """A full disk (ENOSPC while writing a shard): exit 2, one line naming the output, no temporary files."""
    import errno

    root, _ = src
    real = C.write_at

    def full(path, offset, data):
        if offset > 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real(path, offset, data)

    monkeypatch.setattr(C, "write_at", full)
    out = tmp_path / "o"
    assert main([str(root), "-o", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fp4ref quantize: error: output {str(out)!r} not written: No space")
    assert _listing(tmp_path) == []


def test_low_sqnr_tensors_are_reported(tmp_path, capsys):
    """Weights far below the float32 normal range quantize (as the recipe says) to almost nothing: exit 0, one
    warning naming the worst tensor, even with --quiet; ordinary weights give no warning."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(4)
    save_file({"tiny.weight": (rng.standard_normal((64, 64)) * 1e-39).astype(np.float32),
               "ok.weight": rng.standard_normal((64, 64)).astype(np.float32)}, str(tmp_path / "m.safetensors"))
    assert main([str(tmp_path / "m.safetensors"), "-o", str(tmp_path / "o.safetensors"), "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "warning: 1 tensor(s)" in err[0] and "'tiny.weight'" in err[0], err
    save_file({"ok.weight": rng.standard_normal((64, 64)).astype(np.float32)}, str(tmp_path / "n.safetensors"))
    assert main([str(tmp_path / "n.safetensors"), "-o", str(tmp_path / "p.safetensors"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_sharded_input_refuses_a_safetensors_output_name(src, tmp_path, capsys):
    """A sharded checkpoint (or model directory) quantizes into a directory: an -o ending in .safetensors would
    silently be a directory of that name, so it is refused, before anything is written."""
    root, _ = src
    for inp in (root / "model.safetensors.index.json", root):
        assert main([str(inp), "-o", str(tmp_path / "q.safetensors"), "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "output is a directory of shards" in err[0] and "'" + str(tmp_path) in err[0], err
    assert _listing(tmp_path) == []


def test_serving_layout_without_config_json_warns(src, tmp_path, capsys):
    """One weight file has no config.json: the modelopt / compressed-tensors output is written (exit 0) with one
    warning that vLLM / SGLang also need the model's config.json; the fp4ref layout and a model directory with a
    config.json give none."""
    from safetensors.numpy import save_file

    save_file({"l.weight": np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)},
              str(tmp_path / "m.safetensors"))
    for cf, carried in (("modelopt", "hf_quant_config.json"), ("compressed-tensors", "only quantization_config")):
        out = tmp_path / f"o-{cf}"
        assert main([str(tmp_path / "m.safetensors"), "-o", str(out), "--checkpoint-format", cf, "--quiet"]) == 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "warning:" in err[0] and "no config.json" in err[0] and carried in err[0], err
    assert main([str(tmp_path / "m.safetensors"), "-o", str(tmp_path / "f.safetensors"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    # a model directory without config.json: the warning says so (not "lone weight file")
    (tmp_path / "model").mkdir()
    shutil.copyfile(tmp_path / "m.safetensors", tmp_path / "model" / "m.safetensors")
    assert main([str(tmp_path / "model"), "-o", str(tmp_path / "o-dir"), "--checkpoint-format", "modelopt",
                 "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model has no config.json" in err[0] and "lone" not in err[0], err
    assert "put the model's config.json in" in err[0], err
    assert (src[0] / "config.json").is_file()
    assert main([str(src[0]), "-o", str(tmp_path / "d"), "--checkpoint-format", "modelopt", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_python_m_fp4ref_runs_the_cli():
    import subprocess
    import sys

    from fp4ref import __version__

    r = subprocess.run([sys.executable, "-m", "fp4ref", "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"fp4ref {__version__}", (r.stdout, r.stderr)


def test_stale_temporaries_of_dead_runs_are_removed(src, tmp_path):
    """A run killed outright leaves .OUT.fp4ref-tmp-PID-*; the next run to OUT removes it unless PID still runs."""
    import subprocess
    import sys

    root, _ = src
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # that process has exited
    stale = tmp_path / f".o.fp4ref-tmp-{dead_pid}-abc"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    live = tmp_path / f".o.fp4ref-tmp-{os.getppid()}-def"  # a running process (this test's parent)
    live.mkdir()
    other = tmp_path / ".p.fp4ref-tmp-1-x"  # another output's
    other.mkdir()
    assert main([str(root), "-o", str(tmp_path / "o"), "--quiet"]) == 0
    assert not stale.exists() and live.exists() and other.exists()


def test_ctrl_c_leaves_no_partial_output(src, tmp_path, capsys, monkeypatch):
    root, _ = src
    out = tmp_path / "o"
    calls = []
    real = C._quant_task

    def interrupted(task):
        calls.append(task.name)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(task)

    monkeypatch.setattr(C, "_quant_task", interrupted)
    assert main([str(root), "-o", str(out), "--checkpoint-format", "modelopt"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "fp4ref quantize: interrupted; no partial output left"
    assert [e for e in err if not e.startswith(("fp4ref quantize: amax ", "fp4ref quantize: write "))] == [err[-1]]
    assert _listing(tmp_path) == []
    # with --force over a previous output: the old output stays as it was
    monkeypatch.setattr(C, "_quant_task", real)
    assert main([str(root), "-o", str(out), "--checkpoint-format", "modelopt", "--quiet"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (out / "config.json").write_text("{}\n")  # marks the old output
    monkeypatch.setattr(C, "_quant_task", interrupted)
    calls.clear()
    assert main([str(root), "-o", str(out), "--checkpoint-format", "modelopt", "--force", "--quiet"]) == 130
    assert _listing(tmp_path) == ["o"] and sorted(before) == _listing(out)
    assert (out / "config.json").read_text() == "{}\n"
    assert all((out / n).read_bytes() == b for n, b in before.items() if n != "config.json")


def test_ctrl_c_while_the_report_prints_keeps_the_complete_output(src, tmp_path, capsys, monkeypatch):
    """Ctrl-C after the output is published (while the table prints): exit 130, one line saying it is complete."""
    import fp4ref.quantize_file as Q

    root, _ = src
    out = tmp_path / "o"

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(Q, "print_report", interrupted)
    assert main([str(root), "-o", str(out), "--checkpoint-format", "modelopt"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"fp4ref quantize: interrupted while printing the report; {out} is complete"
    from fp4ref.audit import audit_checkpoint

    assert (out / "model.safetensors.index.json").exists() and audit_checkpoint(out).clean  # complete and valid


def _start_big_quantize(tmp_path, seed: int, new_session: bool = False):
    """Start ``fp4ref quantize --jobs 2`` on 128 MiB with the float64 reference recipe ("exact") in a subprocess (its
    own process group with ``new_session``) and return (process, output path) once its first progress line shows
    the workers have started."""
    import subprocess
    import sys

    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    save_file({f"l{i}.weight": rng.standard_normal((1024, 2048), dtype=np.float32) for i in range(16)},
              str(tmp_path / "big.safetensors"))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "fp4ref.quantize_file", str(tmp_path / "big.safetensors"), "-o",
                             str(out), "--jobs", "2", "--recipe", "exact"], stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=str(Path(__file__).resolve().parent.parent),
                            start_new_session=new_session)
    line = proc.stderr.readline()  # the first plain progress line: work has started
    assert line.startswith("fp4ref quantize:"), line
    return proc, out


def _assert_ended(pids) -> None:
    """Each process in ``pids`` ends (or is a zombie) within 10 s."""
    import time

    for pid in pids:
        deadline = time.time() + 10
        while Path(f"/proc/{pid}").exists() and time.time() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], pid


@pytest.mark.parametrize("signame, status, word", [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")])
def test_ctrl_c_signal_with_workers(tmp_path, signame, status, word):
    """A real SIGINT (Ctrl-C) or SIGTERM (kill) to the CLI while --jobs 2 workers run: exit 130 / 143, one line,
    no output, no temporary files, no worker left running."""
    import signal
    import time

    proc, out = _start_big_quantize(tmp_path, 1)
    time.sleep(0.2)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    time.sleep(0.2)
    workers = children.read_text().split() if children.exists() else []  # (Linux with /proc children lists)
    proc.send_signal(getattr(signal, signame))
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal arrived")
    assert proc.returncode == status, err
    lines = [e for e in err.splitlines() if "%" not in e]
    if out.exists():  # a SIGINT after the output was published, while the report printed
        assert signame == "SIGINT"
        assert lines == [f"fp4ref quantize: interrupted while printing the report; {out} is complete"], err
        assert sorted(_listing(tmp_path)) == ["big.safetensors", "out"]
    else:
        assert lines == [f"fp4ref quantize: {word}; no partial output left"], err
        assert _listing(tmp_path) == ["big.safetensors"]
    _assert_ended(workers)  # (Linux) the worker processes ended with the run


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="Linux /proc children lists")
@pytest.mark.parametrize("how", ["timeout", "double_ctrl_c", "double_term"])
def test_a_second_signal_during_the_clean_up_is_ignored(tmp_path, how):
    """Two signals while --jobs 2 workers run, as GNU timeout sends them (SIGTERM to the process, then to its whole
    group), as a user pressing Ctrl-C twice (SIGINT to the group), or SIGTERM twice to the process: the first starts
    the clean-up and the second cannot break it (the pool's shutdown once hung for good, workers left behind):
    the run ends with one line and the first signal's status, no output, no worker left."""
    import signal
    import subprocess
    import time

    proc, out = _start_big_quantize(tmp_path, 3, new_session=True)
    time.sleep(0.4)
    workers = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    first, second = {"timeout": (lambda: os.kill(proc.pid, signal.SIGTERM),
                                 lambda: os.killpg(proc.pid, signal.SIGTERM)),
                     "double_ctrl_c": (lambda: os.killpg(proc.pid, signal.SIGINT),) * 2,
                     "double_term": (lambda: os.kill(proc.pid, signal.SIGTERM),) * 2}[how]
    first()
    time.sleep(0.02)
    second()
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{how}: the run hung after the second signal")
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal arrived")
    status, word = (130, "interrupted") if how == "double_ctrl_c" else (143, "terminated")
    assert proc.returncode == status, err
    assert [e for e in err.splitlines() if "%" not in e] == [f"fp4ref quantize: {word}; no partial output left"], err
    assert _listing(tmp_path) == ["big.safetensors"]
    _assert_ended(workers)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="Linux /proc children lists")
def test_workers_die_with_a_killed_main_process(tmp_path):
    """SIGKILL to the CLI while --jobs 2 workers run: the workers end too (PR_SET_PDEATHSIG); the temporary output it
    could not remove is removed by the next run to the same output."""
    import signal
    import time

    proc, out = _start_big_quantize(tmp_path, 2)
    time.sleep(0.3)
    workers = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert workers
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    _assert_ended(workers)
    stale = [p for p in tmp_path.iterdir() if p.name.startswith(".out.fp4ref-tmp-")]
    if not stale:
        pytest.skip("killed before the temporary output was made")
    loc = C.OutputLocation(out, is_dir=False, force=False)
    loc.create()
    loc.discard()
    assert _listing(tmp_path) == ["big.safetensors"]


def test_corrupt_and_truncated_inputs_are_named(src, tmp_path, capsys):
    root, _ = src
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in root.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    data = (bad / SHARD2).read_bytes()
    (bad / SHARD2).write_bytes(data[:-100])
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8: 8 + n])
    last = max((h["data_offsets"][1], k) for k, h in header.items() if k != "__metadata__")[1]
    assert main([str(bad), "-o", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert SHARD2 in err and "truncated" in err and repr(last) in err  # the file and the tensor cut off
    (bad / SHARD2).write_bytes(data)
    index = json.loads((bad / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = SHARD1
    (bad / "model.safetensors.index.json").write_text(json.dumps(index))
    assert main([str(bad), "-o", str(tmp_path / "o"), "--quiet"]) == 2
    assert "'lm_head.weight'" in capsys.readouterr().err
    index["weight_map"]["lm_head.weight"] = "model-00003-of-00002.safetensors"
    (bad / "model.safetensors.index.json").write_text(json.dumps(index))
    assert main([str(bad), "-o", str(tmp_path / "o"), "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err
    (bad / "model.safetensors.index.json").write_text("{not json")
    assert main([str(bad), "-o", str(tmp_path / "o"), "--quiet"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert _listing(tmp_path) == ["bad"]


def test_dry_run_and_bad_arguments(src, tmp_path, capsys):
    root, _ = src
    assert main([str(root), "--dry-run", "--checkpoint-format", "modelopt"]) == 0
    table = capsys.readouterr().out
    assert "nothing written" in table and "quantized nvfp4" in table and "ignored" in table
    # piped: one line per tensor, the reason whole (the table is as wide as it needs)
    assert any(DOWN72 in ln and "copied as is: K=72 is not a positive multiple of 16" in ln
               for ln in table.splitlines()), table
    assert _listing(tmp_path) == []
    # with an output that exists, the plan says the run would need --force (and still writes nothing)
    (tmp_path / "taken").mkdir()
    for force, note in (([], True), (["--force"], False)):
        assert main([str(root), "-o", str(tmp_path / "taken"), "--dry-run", "--quiet"] + force) == 0
        assert ("exists; the run itself needs --force" in capsys.readouterr().err) == note
    (tmp_path / "taken").rmdir()
    cases = [
        ([str(root), "-o", str(tmp_path / "o"), "--checkpoint-format", "compressed-tensors", "--recipe", "modelopt"],
         "cannot be stored in compressed-tensors"),
        ([str(root), "-o", str(tmp_path / "o"), "--checkpoint-format", "modelopt", "--ignore", r"k_proj"],
         "fused layer model.layers.0.self_attn.qkv"),
        ([str(root), "-o", str(tmp_path / "o"), "--dtype", "float16"], "--dtype applies to --dequantize only"),
        ([str(root), "-o", str(tmp_path / "o"), "--dequantize", "--checkpoint-format", "modelopt"],
         "--checkpoint-format does not apply"),
        ([str(root)], "-o/--output"),
        ([str(root / SHARD1), "-o", str(tmp_path / "o.safetensors"), "--checkpoint-format", "modelopt"],
         "give out_path (-o) a directory"),
        ([str(root), "-o", str(tmp_path / "o"), "--ignore", "("], "not a valid regular expression"),
        ([str(root / "config.json"), "-o", str(tmp_path / "o")], "not a readable safetensors file"),
    ]
    for argv, msg in cases:
        assert main(argv) == 2, argv
        assert msg in capsys.readouterr().err, argv
        assert _listing(tmp_path) == [], argv
    with pytest.raises(SystemExit) as ex:
        main([str(root), "-o", str(tmp_path / "o"), "--jobs", "0"])
    assert ex.value.code == 2
    # quantizing a quantized checkpoint again is refused
    C.quantize_checkpoint(root, tmp_path / "q", checkpoint_format="compressed-tensors")
    with pytest.raises(C.QuantizeFileError, match="already quantized"):
        C.quantize_checkpoint(tmp_path / "q", tmp_path / "q2", checkpoint_format="modelopt")
    # ... and so is one of its shards copied on its own, without fp4ref's metadata or the config files (its
    # remaining bf16 tensors were quantized again, and the packed codes copied as they are)
    for layout, fmt in (("modelopt", "nvfp4"), ("compressed-tensors", "mxfp4"), ("modelopt", "mxfp8")):
        q = tmp_path / f"q-{layout}-{fmt}"
        C.quantize_checkpoint(root, q, checkpoint_format=layout, fmt=fmt)
        shard = q / SHARD1
        raw_bytes = shard.read_bytes()
        n = int.from_bytes(raw_bytes[:8], "little")
        header = json.loads(raw_bytes[8:8 + n])
        header.pop("__metadata__", None)
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        bare = tmp_path / f"bare-{layout}-{fmt}.safetensors"
        bare.write_bytes(len(text).to_bytes(8, "little") + text + raw_bytes[8 + n:])
        with pytest.raises(C.QuantizeFileError, match=r"already quantized \(.*weight_scale \((F8_E4M3|U8) \[.*is the "
                                                      r"block-scale tensor of a quantized layer\)"):
            C.quantize_checkpoint(bare, tmp_path / f"again-{layout}-{fmt}.safetensors")


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_an_fp4ref_layout_file_without_metadata_is_known_as_quantized(tmp_path, fmt):
    """fp4ref's layout stores a layer X as codes X beside its scale X_scale, names that need not hold "weight": with
    the shard metadata stripped, the pair still marks the file as quantized (quantizing it again would copy the codes
    as they are and quantize what is left). A U8 tensor whose "_scale" partner has other rows is not such a pair."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(7)
    f = tmp_path / "plain.safetensors"
    save_file({"w1": rng.standard_normal((8, 64)).astype(np.float32),
               "w2": rng.standard_normal((4, 32)).astype(np.float32)}, str(f))
    q = tmp_path / "q.safetensors"
    C.quantize_checkpoint(f, q, fmt=fmt)
    bare = tmp_path / "bare.safetensors"
    raw_bytes = q.read_bytes()
    n = int.from_bytes(raw_bytes[:8], "little")
    header = json.loads(raw_bytes[8:8 + n])
    assert "__metadata__" in header and set(header) - {"__metadata__"} >= {"w1", "w1_scale", "w2", "w2_scale"}
    header.pop("__metadata__")
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    bare.write_bytes(len(text).to_bytes(8, "little") + text + raw_bytes[8 + n:])
    with pytest.raises(C.QuantizeFileError, match=r"already quantized \(w[12]_scale \((F8_E4M3|U8) \[[48], \d+\]\) is "
                                                  r"the block-scale tensor of a quantized layer\)"):
        C.quantize_checkpoint(bare, tmp_path / "again.safetensors", fmt=fmt)
    # U8 data beside a "_scale" tensor of other rows is no such pair: quantized as usual (the float tensor)
    other = tmp_path / "other.safetensors"
    save_file({"ids": np.arange(64, dtype=np.uint8).reshape(8, 8), "ids_scale": np.ones((4, 2), np.uint8),
               "w": rng.standard_normal((4, 32)).astype(np.float32)}, str(other))
    reps = C.quantize_checkpoint(other, tmp_path / "other-q.safetensors", fmt=fmt)
    assert [(r.name, r.action) for r in reps] == [("ids", "copied"), ("ids_scale", "copied"), ("w", "quantized")]


def test_an_unwritable_output_directory_is_refused_before_any_work(src, tmp_path, capsys, monkeypatch):
    """The parent's write permission is checked up front (and by --dry-run), not when the output is built after
    the amax pass. os.access is patched for that one directory: a root user's access() ignores the mode bits."""
    from fp4ref import checkpoint_io

    root, _ = src
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(checkpoint_io.os, "access",
                        lambda p, mode, **kw: False if Path(p) == locked else real(p, mode, **kw))
    monkeypatch.setattr(C, "Workers", _NoWork)
    for extra in ([], ["--dry-run"]):
        assert main([str(root), "-o", str(locked / "o"), "--quiet"] + extra) == 2
        err = capsys.readouterr().err
        assert "is not writable" in err and str(locked) in err, err
    assert _listing(locked) == []
    assert main([str(root), "-o", str(tmp_path / "o"), "--dry-run"]) == 0  # other directories are unaffected
    capsys.readouterr()


PSEUDO_DIRS = [d for d in ("/proc", "/sys") if os.path.isdir(d)]  # file systems that create no files


@pytest.mark.skipif(not PSEUDO_DIRS, reason="no /proc or /sys here")
@pytest.mark.parametrize("where", PSEUDO_DIRS)
def test_an_output_in_a_directory_that_creates_no_files_is_refused_before_any_work(src, modelopt_out, where,
                                                                                   capsys, monkeypatch):
    """/proc and /sys accept no new file, yet a root user's access() says they are writable: a new file there
    was refused only when the output was built, after the amax pass over every weight. The output's directory
    is now tried up front (and by --dry-run). os.access is patched to answer as it does for root, so the test
    does not depend on the user running it."""
    from fp4ref import checkpoint_io

    root, _ = src
    real = os.access
    monkeypatch.setattr(checkpoint_io.os, "access",
                        lambda p, mode, **kw: True if str(p) == where else real(p, mode, **kw))
    monkeypatch.setattr(C, "Workers", _NoWork)
    out = os.path.join(where, "fp4ref-test-output")
    for argv, target in (([str(root), "-o", out, "--quiet"], out),  # a directory of shards
                         ([str(root / SHARD1), "-o", out + ".safetensors", "--quiet"], out + ".safetensors"),
                         ([str(root), "-o", out, "--quiet", "--dry-run"], out),
                         ([str(modelopt_out), "-o", out, "--quiet", "--dequantize"], out)):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"output path {target!r}: cannot create files in {where!r}" in err, (argv, err)
        assert not os.path.lexists(target)


def test_subdirectories_of_the_input_are_named_as_not_copied(src, tmp_path, capsys):
    root = tmp_path / "in"
    shutil.copytree(src[0], root)
    (root / "original").mkdir()
    (root / "original" / "consolidated.00.pth").write_bytes(b"x" * 10)
    (root / ".cache").mkdir()  # hidden: not named
    assert main([str(root), "--dry-run", "-o", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "note: subdirectories of " in err and "would not be copied" in err and "original/" in err, err
    assert ".cache" not in err
    assert main([str(root), "-o", str(tmp_path / "o"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "were not copied" in err and "original/" in err, err
    assert not (tmp_path / "o" / "original").exists()
    assert C.open_checkpoint(root).sub_dirs == [root / "original"]


def test_python_arguments_of_the_wrong_type_or_empty_paths_are_refused(src, tmp_path, capsys):
    root, _ = src
    out = tmp_path / "o"
    cases = [
        (dict(ignore="lm_head"), TypeError, r"ignore='lm_head'.*one pattern: ignore=\['lm_head'\]"),
        (dict(ignore=[re.compile("x")]), TypeError, "ignore=.*list or tuple of regular expressions"),
        (dict(include=["q_proj"]), TypeError, r"include=\['q_proj'\]: expected a regular expression"),
        (dict(force="no"), TypeError, "force='no': expected True or False"),
        (dict(dry_run=1), TypeError, "dry_run=1: expected True or False"),
        (dict(pad=None), TypeError, "pad=None"),
        (dict(progress="yes"), TypeError, "progress='yes'"),
        (dict(force=np.bool_(True)), TypeError, r"force=.*: expected True or False \(a Python bool\), got numpy\.bool"),
        (dict(jobs=2.0), TypeError, r"jobs=2\.0 \(--jobs\): expected an integer >= 1, got float"),
        (dict(jobs="2"), TypeError, r"jobs='2' \(--jobs\): expected an integer >= 1, got str"),
        (dict(jobs=True), TypeError, r"jobs=True \(--jobs\): expected an integer >= 1, got bool"),
    ]
    for kwargs, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            C.quantize_checkpoint(root, out, **kwargs)
    with pytest.raises(TypeError, match="force='yes'"):
        C.dequantize_checkpoint(root, out, force="yes")
    for fn in (C.quantize_checkpoint, C.dequantize_checkpoint):
        with pytest.raises(C.QuantizeFileError, match=r"jobs=0 \(--jobs\): expected an integer >= 1"):
            fn(root, out, jobs=0)
    assert C.quantize_checkpoint(root, None, jobs=np.int64(2), dry_run=True)  # a numpy integer is an integer
    with pytest.raises(TypeError, match="path=None: expected a path"):
        C.read_dequantized(None, "x")
    with pytest.raises(TypeError, match="input=3: expected a path"):
        C.quantize_checkpoint(3, out)
    with pytest.raises(TypeError, match="output=b'o': expected a path"):
        C.quantize_checkpoint(root, b"o")
    with pytest.raises(TypeError, match="output=None: expected a path"):
        C.quantize_checkpoint(root, None)
    # both paths bad: the input is named first (the output was, whatever the order of the arguments)
    for fn in (C.quantize_checkpoint, C.dequantize_checkpoint):
        with pytest.raises(TypeError, match="input=b'in': expected a path"):
            fn(b"in", b"out")
    assert C.quantize_checkpoint(root, None, dry_run=True)  # a plan without an output to check
    # an empty path is not the current directory
    for args in (("", out), (root, "")):
        with pytest.raises(C.CheckpointError, match="empty path"):
            C.quantize_checkpoint(*args)
    with pytest.raises(C.CheckpointError, match="output is an empty path"):
        C.dequantize_checkpoint(root, "")
    assert main(["", "-o", str(out)]) == 2
    assert "input is an empty path" in capsys.readouterr().err
    assert main([str(root), "-o", ""]) == 2
    assert "output is an empty path" in capsys.readouterr().err
    assert _listing(tmp_path) == []


def test_plain_progress_lines_when_not_a_terminal(src, tmp_path, capsys):
    root, _ = src
    assert main([str(root), "-o", str(tmp_path / "o"), "--format", "mxfp8"]) == 0
    cap = capsys.readouterr()
    lines = cap.err.splitlines()
    assert lines and all(ln.startswith("fp4ref quantize: ") for ln in lines)
    assert any(": amax 100.0%" in ln for ln in lines) and any(": write 100.0%" in ln for ln in lines)
    # sizes in the unit of the phase's total: this small checkpoint in KiB, never "0.0 / 0.0 MiB"
    assert all(re.search(r"\(\d+\.\d / [1-9]\d*\.\d KiB\)", ln) for ln in lines), lines
    assert "SQNR dB" in cap.out and "max |err|" in cap.out and "model.layers.0.self_attn.q_proj.weight" in cap.out


def test_single_file_to_directory(src, tmp_path):
    root, tensors = src
    out = tmp_path / "one"
    C.quantize_checkpoint(root / SHARD1, out, checkpoint_format="modelopt")
    assert _listing(out) == sorted(["hf_quant_config.json", SHARD1])
    assert os.stat(out / SHARD1).st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    u = os.umask(0)
    os.umask(u)
    return u


def test_in_out_expert_layouts_are_not_blocked_along_the_output_axis(src, tmp_path, capsys):
    root, _ = src
    alt = tmp_path / "llama4"
    shutil.copytree(root, alt)
    (alt / "config.json").write_text(json.dumps({"architectures": ["Llama4ForConditionalGeneration"]}))
    reps = {r.name: r for r in C.quantize_checkpoint(alt, tmp_path / "o", checkpoint_format="modelopt",
                                                     dry_run=True)}
    assert all(reps[n].action == "copied" and "[experts, in, out]" in reps[n].reason for n in EXPERTS_3D)
    # the long reason stays on its tensor's line in a piped table (a 160-column table folded it)
    assert main([str(alt), "--dry-run", "--checkpoint-format", "modelopt"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(EXPERTS_3D[0] in ln and "(ModelOpt transposes these first; fp4ref does not)" in ln for ln in lines)
    assert reps[QKV[0]].action == "quantized"


# ------------------------------------------------------------------------------------- messages (review list)


def test_a_bad_dtype_names_the_python_argument_and_the_values(modelopt_out, tmp_path, capsys):
    """dequantize_checkpoint / read_dequantized name their own argument ``dtype`` (the CLI names --dtype), list the
    accepted values, and read_dequantized's docstring lists them too."""
    with pytest.raises(ValueError, match=r"^dtype='x' is not one of float32, bfloat16, float16$"):
        C.dequantize_checkpoint(modelopt_out, tmp_path / "d", dtype="x")
    with pytest.raises(ValueError, match=r"^dtype='x' is not one of float64, float32, bfloat16, float16$"):
        C.read_dequantized(modelopt_out, QKV[0], dtype="x")
    exact = C.read_dequantized(modelopt_out, QKV[0])
    assert exact.dtype == np.float64
    np.testing.assert_array_equal(C.read_dequantized(modelopt_out, QKV[0], dtype="float64"), exact)
    assert C.read_dequantized(modelopt_out, QKV[0], dtype="bfloat16").dtype == ml_dtypes.bfloat16
    doc = " ".join(C.read_dequantized.__doc__.split())
    for v in ('"float64"', '"float32"', '"bfloat16"', '"float16"'):
        assert v in doc, doc
    assert main([str(modelopt_out), "-o", str(tmp_path / "d"), "--dequantize", "--dtype", "x", "--quiet"]) == 2
    assert "error: --dtype 'x' is not one of float32, bfloat16, float16" in capsys.readouterr().err
    assert _listing(tmp_path) == []


def test_a_recipe_or_mode_of_the_wrong_type_or_name_is_named_with_the_names(src, tmp_path):
    root, _ = src
    names = r"\['te', 'sol', .*'te-4over6-mse-256'\]"
    with pytest.raises(TypeError, match=rf"^recipe=1 \(--recipe\): expected an NVFP4Recipe or one of its names "
                                        rf"{names}, got int$"):
        C.quantize_checkpoint(root, tmp_path / "o", recipe=1)
    with pytest.raises(C.QuantizeFileError, match=rf"^recipe='zz' \(--recipe\) is not one of {names}$"):
        C.quantize_checkpoint(root, tmp_path / "o", recipe="zz")
    with pytest.raises(TypeError, match=r"^mode=2 \(--mode\): expected an MXMode or one of its names \['floor', "):
        C.quantize_checkpoint(root, tmp_path / "o", fmt="mxfp4", mode=2)
    with pytest.raises(C.QuantizeFileError, match=r"^mode='up' \(--mode\) is not one of \['floor', "):
        C.quantize_checkpoint(root, tmp_path / "o", fmt="mxfp4", mode="up")
    # the enum members themselves are accepted (str() of a str-enum member is not its value)
    from fp4ref.blockscale import MXMode, NVFP4Recipe

    assert C.resolve_target("fp4ref", "nvfp4", NVFP4Recipe.SOL).recipe is NVFP4Recipe.SOL
    assert C.resolve_target("fp4ref", "mxfp8", mode=MXMode.RCEIL).mode is MXMode.RCEIL
    assert C.quantize_checkpoint(root, None, recipe=NVFP4Recipe.SOL, dry_run=True)
    assert _listing(tmp_path) == []


def test_a_dry_run_reports_no_timing(src, capsys):
    """Planned tensors are not timed: seconds is NaN (as the statistics) and the ms cell is "-", not 0.0."""
    root, _ = src
    reps = C.quantize_checkpoint(root, None, dry_run=True)
    planned = [r for r in reps if r.action == "quantized"]
    assert planned and all(np.isnan(r.seconds) for r in planned)
    assert main([str(root), "--dry-run"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if "quantized nvfp4" in ln]
    assert len(rows) == len(planned)
    for ln in rows:
        cells = [c.strip() for c in ln.split("│")[1:-1]]
        assert cells[-4:] == ["-", "-", "-", "-"], ln  # SQNR, max |err|, zero blocks, ms


def test_force_says_why_it_does_not_replace_another_layouts_output(src, modelopt_out, tmp_path, capsys):
    """A ModelOpt output is not replaced by a compressed-tensors one (hf_quant_config.json would be left over):
    the message says the directory holds another layout's output, not "the same checkpoint only"."""
    root, _ = src
    out = tmp_path / "o"
    shutil.copytree(modelopt_out, out)
    before = _listing(out)
    assert main([str(root), "-o", str(out), "--checkpoint-format", "compressed-tensors", "--force", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "holds 'hf_quant_config.json', which the new output does not replace: it holds the output of another " \
           "checkpoint or of another layout (--checkpoint-format)" in err, err
    assert "same checkpoint only" not in err and "remove it or choose another output path" in err
    assert _listing(out) == before and _listing(tmp_path) == ["o"]


def test_padded_tensors_are_reported_with_their_stored_k(tmp_path, capsys):
    """--pad changes the stored shape: the report carries the stored K (K = 40 -> 48 for NVFP4's 16-blocks, 64 for
    MXFP4's 32), and the table's action says it; a K already a multiple of the block reports 0 and no note."""
    from safetensors.numpy import save_file

    f = tmp_path / "k40.safetensors"
    save_file({"w": np.linspace(-3, 3, 160, dtype=np.float32).reshape(4, 40),
               "v": np.linspace(-1, 2, 64, dtype=np.float32).reshape(2, 32)}, str(f))
    for fmt, stored in (("nvfp4", 48), ("mxfp4", 64)):
        for dry in (True, False):
            out = None if dry else tmp_path / f"o-{fmt}"
            reps = {r.name: r for r in C.quantize_checkpoint(f, out, fmt=fmt, dry_run=dry, pad=True)}
            assert (reps["w"].padded_to, reps["v"].padded_to) == (stored, 0)
    capsys.readouterr()
    assert main([str(f), "-o", str(tmp_path / "cli"), "--pad"]) == 0
    padded = [line for line in capsys.readouterr().out.splitlines() if "K padded to" in line]
    assert len(padded) == 1 and re.search(r"\bw\b.*quantized nvfp4, K padded to 48", padded[0]), padded


def test_no_quantizable_tensor_suggests_pad_when_padding_helps(tmp_path, capsys):
    from safetensors.numpy import save_file

    f = tmp_path / "k20.safetensors"
    save_file({"w": np.ones((4, 20), np.float32), "b": np.ones(3, np.float32)}, str(f))
    for fmt, block in (("nvfp4", 16), ("mxfp4", 32)):
        with pytest.raises(C.QuantizeFileError, match=rf"w: K=20 is not a positive multiple of {block}\); pass --pad "
                                                      rf"\(in Python: pad=True\) to zero-pad K to a multiple of "
                                                      rf"{block}: 1 tensor\(s\) would be quantized then"):
            C.quantize_checkpoint(f, None, fmt=fmt, dry_run=True)
    assert main([str(f), "--dry-run"]) == 2
    assert "pass --pad" in capsys.readouterr().err
    assert [r.action for r in C.quantize_checkpoint(f, None, dry_run=True, pad=True)] == ["copied", "quantized"]
    # no hint where --pad would not help (K = 0) or does not apply (the serving layouts)
    save_file({"w": np.ones((4, 0), np.float32)}, str(tmp_path / "k0.safetensors"))
    with pytest.raises(C.QuantizeFileError, match=r"K=0 is not a positive multiple of 16\)$"):
        C.quantize_checkpoint(tmp_path / "k0.safetensors", None, dry_run=True)
    save_file({"x.weight": np.ones((4, 20), np.float32)}, str(tmp_path / "lin.safetensors"))
    with pytest.raises(C.QuantizeFileError, match=r"K=20 is not a positive multiple of 16\)$"):
        C.quantize_checkpoint(tmp_path / "lin.safetensors", tmp_path / "o", checkpoint_format="modelopt")


def test_a_dry_run_says_it_reads_no_values(tmp_path, capsys):
    """The plan reads headers only: a NaN/inf weight is planned as quantized (exit 0) and the plan says so in a
    line under its table; the real run refuses the tensor."""
    from safetensors.numpy import save_file

    from fp4ref.quantize_file import DRY_RUN_NOTE

    x = np.ones((2, 32), np.float32)
    x[1, 3] = np.nan
    f = tmp_path / "nan.safetensors"
    save_file({"bad.weight": x}, str(f))
    assert [r.action for r in C.quantize_checkpoint(f, None, dry_run=True)] == ["quantized"]
    for quiet in ([], ["--quiet"]):
        assert main([str(f), "--dry-run"] + quiet) == 0
        out = capsys.readouterr().out
        assert out.rstrip("\n").splitlines()[-1] == DRY_RUN_NOTE, out
    assert DRY_RUN_NOTE == ("fp4ref quantize: note: a dry run reads the tensor headers only, not their values, so it "
                            "cannot see what the real run refuses for values: weights holding NaN/inf, and MX weights "
                            "whose decoded values would overflow; it lists them as quantized")
    # (the --help text: tests/test_quantize_file.py)
    assert main([str(f), "-o", str(tmp_path / "o.safetensors"), "--quiet"]) == 2
    assert "'bad.weight' holds 1 NaN/inf value(s)" in capsys.readouterr().err
    assert _listing(tmp_path) == ["nan.safetensors"]  # nothing written


def test_an_mx_value_that_would_decode_to_inf_is_refused_and_floor_keeps_it_finite(tmp_path, capsys):
    """MX modes that round the block scale up take a block with amax 3.4e38 to scale 2^126 (E2M1) / 2^120 (E4M3),
    where 3.4e38 rounds to code 4 / 256: 2^128 after decoding, inf in float32. The tensor is refused (named, nothing
    written); floor (the OCP rule) gives scale 2^125 and the saturated code 6: 6 * 2^125, finite."""
    from safetensors.numpy import save_file

    x = np.full((4, 32), 0.5, np.float32)
    x[0, 0] = 3.4e38
    f = tmp_path / "near.safetensors"
    save_file({"layer.weight": x}, str(f))
    for fmt in ("mxfp4", "mxfp8"):
        for mode in ("ceil", "even", "rceil", "rceil-torchao"):
            want = (rf"^tensor 'layer.weight': with mode='{mode}' \(--mode\), 1 value\(s\) near the float32 maximum "
                    rf"quantize to {fmt} code x scale >= 2\^128, past the float32 range, which decodes to inf in "
                    r"float32; quantize it with mode='floor' \(--mode floor; ")
            with pytest.raises(C.QuantizeFileError, match=want):
                C.quantize_checkpoint(f, tmp_path / "o.safetensors", fmt=fmt, mode=mode)
    assert main([str(f), "-o", str(tmp_path / "mo"), "--format", "mxfp8", "--checkpoint-format", "modelopt",
                 "--quiet"]) == 2  # ModelOpt's MXFP8 layout rounds the scale up (rceil)
    assert "with mode='rceil' (--mode), 1 value(s) near the float32 maximum" in capsys.readouterr().err
    assert _listing(tmp_path) == ["near.safetensors"]  # nothing written, no temporary left
    out = tmp_path / "floor.safetensors"
    C.quantize_checkpoint(f, out, fmt="mxfp4", mode="floor")
    d = C.read_dequantized(out, "layer.weight")
    assert d[0, 0] == 6 * 2.0**125 and np.all(d[1:] == 0.5)


@pytest.mark.parametrize("fmt,ok,bad,ok_decoded", [
    # ceil: scale 2^14 (E2M1) / 2^8 (E4M3); 57312 / 2^14 = 3.498 -> 3, 57344 / 2^14 = 3.5 -> 4 (ties to even):
    # 4 * 2^14 = 2^16 = inf in float16; 63456 / 2^8 = 247.875 -> 240, 63488 / 2^8 = 248 -> 256 (ties to even)
    ("mxfp4", 57312.0, 57344.0, 3 * 2.0**14),
    ("mxfp8", 63456.0, 63488.0, 240 * 2.0**8),
])
def test_the_mx_overflow_refusal_is_relative_to_the_weights_own_dtype(tmp_path, fmt, ok, bad, ok_decoded):
    """A float16 weight whose decoded value would pass 65504 is refused as a float32 one past 2^128 is (the
    dequantized checkpoint, in the weight's own dtype, would hold inf); the largest float16 below the threshold
    quantizes, decoding to the hand-derived value; a bfloat16 weight at its maximum is refused too."""
    from safetensors.numpy import save_file

    for name, v in (("ok", ok), ("bad", bad)):
        x = np.full((2, 32), 1.0, np.float16)
        x[1, 5] = v
        save_file({"w.weight": x}, str(tmp_path / f"{name}.safetensors"))
    C.quantize_checkpoint(tmp_path / "ok.safetensors", tmp_path / "q.safetensors", fmt=fmt, mode="ceil")
    assert C.read_dequantized(tmp_path / "q.safetensors", "w.weight")[1, 5] == ok_decoded
    with pytest.raises(C.QuantizeFileError, match=r"^tensor 'w.weight': with mode='ceil' \(--mode\), 1 value\(s\) "
                                                  r"near the float16 maximum quantize to .* >= 2\^16, past the "
                                                  r"float16 range"):
        C.quantize_checkpoint(tmp_path / "bad.safetensors", tmp_path / "r.safetensors", fmt=fmt, mode="ceil")
    assert not (tmp_path / "r.safetensors").exists()
    xb = np.full((2, 32), 1.0, ml_dtypes.bfloat16)
    xb[0, 0] = ml_dtypes.finfo(ml_dtypes.bfloat16).max
    save_file({"w.weight": xb}, str(tmp_path / "b.safetensors"))
    with pytest.raises(C.QuantizeFileError, match=r"near the bfloat16 maximum quantize to .* >= 2\^128"):
        C.quantize_checkpoint(tmp_path / "b.safetensors", tmp_path / "rb.safetensors", fmt=fmt, mode="rceil")


def test_a_trailing_separator_asks_for_a_directory_output(src, tmp_path, capsys):
    """-o NAME.safetensors/ (in Python a str ending in a path separator) is a directory output whatever its name:
    not a file named NAME.safetensors, and not refused for a sharded input; without the separator nothing changes."""
    root, _ = src
    assert main([str(root / SHARD1), "-o", str(tmp_path / "new.safetensors") + "/", "--quiet"]) == 0
    assert (tmp_path / "new.safetensors").is_dir() and _listing(tmp_path / "new.safetensors") == [SHARD1]
    assert [r.action for r in C.quantize_checkpoint(root / SHARD1, str(tmp_path / "py.safetensors") + os.sep)]
    assert _listing(tmp_path / "py.safetensors") == [SHARD1]
    assert main([str(root / SHARD1), "-o", str(tmp_path / "q.safetensors"), "--quiet"]) == 0
    assert (tmp_path / "q.safetensors").is_file()  # no separator: one file, as before
    C.dequantize_checkpoint(tmp_path / "q.safetensors", str(tmp_path / "d.safetensors") + "/")
    assert _listing(tmp_path / "d.safetensors") == ["q.safetensors"]
    # a sharded checkpoint: the name is kept (a plan, then the run)
    assert main([str(root), "-o", str(tmp_path / "m.safetensors") + "/", "--dry-run"]) == 0
    assert "nothing written" in capsys.readouterr().out
    assert main([str(root), "-o", str(tmp_path / "m.safetensors") + "/", "--quiet"]) == 0
    assert SHARD1 in _listing(tmp_path / "m.safetensors") and "model.safetensors.index.json" in \
        _listing(tmp_path / "m.safetensors")
    # an existing file of that name is not a directory: refused as the wrong kind
    assert main([str(root / SHARD1), "-o", str(tmp_path / "q.safetensors") + "/", "--quiet", "--force"]) == 2
    assert "'q.safetensors' is a file; expected a directory" in capsys.readouterr().err.replace(str(tmp_path) + "/", "")
    assert (tmp_path / "q.safetensors").is_file()


def test_an_output_inside_a_file_names_the_file(src, tmp_path, capsys):
    """-o model.safetensors/x.safetensors where model.safetensors is a file: the message says it is a file, not
    "output directory ... does not exist"."""
    root, _ = src
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"a user's file")
    out = f / "x.safetensors"
    assert main([str(root / SHARD1), "-o", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == (f"fp4ref quantize: error: output path {str(out)!r}: {str(f)!r} is a file, not a directory; choose "
                   "another output path\n"), err
    (tmp_path / "q").mkdir()
    C.quantize_checkpoint(root / SHARD1, tmp_path / "q" / "q.safetensors")
    deeper = f / "sub" / "x.safetensors"
    for fn, inp in ((C.quantize_checkpoint, root / SHARD1),
                    (C.dequantize_checkpoint, tmp_path / "q" / "q.safetensors")):
        with pytest.raises(C.CheckpointError, match=rf"^output path {re.escape(repr(str(deeper)))}: "
                                                   rf"{re.escape(repr(str(f)))} is a file, not a directory, so the "
                                                   rf"output directory {re.escape(repr(str(f / 'sub')))} cannot exist; "
                                                   "choose another output path$"):
            fn(inp, deeper)
    assert _listing(tmp_path) == ["model.safetensors", "q"] and f.read_bytes() == b"a user's file"
    # a directory that is really missing is still named as missing
    assert main([str(root / SHARD1), "-o", str(tmp_path / "nodir" / "x.safetensors"), "--quiet"]) == 2
    assert "output directory" in capsys.readouterr().err


def test_numpy_dtypes_are_read_by_name_and_other_types_are_type_errors(modelopt_out, tmp_path):
    """dtype=np.float16 (a numpy dtype-like) means "float16", not "dtype=<class 'numpy.float16'> is not one of ...
    float16"; a value that is neither a str nor a numpy dtype is a TypeError naming dtype with the accepted values;
    read_dequantized's name must be a str."""
    assert [C.parse_dtype(x) for x in (np.float16, np.dtype("float32"), ml_dtypes.bfloat16, np.dtype("bfloat16"),
                                       "FLOAT16", "Bf16")] == ["F16", "F32", "BF16", "BF16", "F16", "BF16"]
    assert C.parse_dtype(np.float64, float64=True) == "F64"
    with pytest.raises(ValueError, match=r"^dtype=<class 'numpy\.float64'> \(float64\) is not one of float32, "
                                         r"bfloat16, float16$"):
        C.parse_dtype(np.float64)
    with pytest.raises(ValueError, match=r"^dtype=<class 'numpy\.int8'> \(int8\) is not one of float32, bfloat16, "
                                         r"float16$"):
        C.dequantize_checkpoint(modelopt_out, tmp_path / "d", dtype=np.int8)
    for bad, got in ((16, "int"), ({}, "dict"), (object, "type"), (1.5, "float")):
        with pytest.raises(TypeError, match=rf"^dtype={re.escape(repr(bad))}: expected one of float32, bfloat16, "
                                            r"float16, as a str or a numpy dtype \(np\.float16, "
                                            rf"ml_dtypes\.bfloat16\), got {got}$"):
            C.dequantize_checkpoint(modelopt_out, tmp_path / "d", dtype=bad)
    with pytest.raises(TypeError, match=r"^dtype=None: expected one of float64, float32, bfloat16, float16, as a"):
        C.read_dequantized(modelopt_out, QKV[0], dtype=None)
    assert _listing(tmp_path) == []
    C.dequantize_checkpoint(modelopt_out, tmp_path / "d", dtype=np.float16)
    assert {v.dtype for k, v in load_file(str(tmp_path / "d" / SHARD1)).items() if k in QKV} == {np.dtype(np.float16)}
    got = C.read_dequantized(modelopt_out, QKV[0], dtype=ml_dtypes.bfloat16)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got, C.read_dequantized(modelopt_out, QKV[0], dtype="bf16"))
    for name, got in ((None, "NoneType"), (0, "int"), ([QKV[0]], "list")):
        with pytest.raises(TypeError, match=rf"^name={re.escape(repr(name))}: expected the name of a quantized "
                                            rf"tensor \(str\), got {got}$"):
            C.read_dequantized(modelopt_out, name)


def test_format_and_checkpoint_format_are_case_insensitive(src, tmp_path):
    """fmt / checkpoint_format in any case, as encode(x, "E2M1") and the recipe names: resolved once, stored in
    lower case (the shards' metadata, the reports); a value that is not a str is a TypeError naming it."""
    root, _ = src
    t = C.resolve_target("ModelOpt", "NVFP4")
    assert (t.checkpoint_format, t.fmt, t.option) == ("modelopt", "nvfp4", "modelopt")
    assert C.resolve_target("COMPRESSED-TENSORS", "MxFp4").fmt == "mxfp4"
    plan = C.quantize_checkpoint(root, None, fmt="NVFP4", checkpoint_format="ModelOpt", dry_run=True)
    same = C.quantize_checkpoint(root, None, checkpoint_format="modelopt", dry_run=True)
    assert [(r.name, r.action, r.fmt, r.reason) for r in plan] == [(r.name, r.action, r.fmt, r.reason) for r in same]
    assert "nvfp4" in {r.fmt for r in plan}
    from fp4ref.quantize_file import quantize_file

    reps = quantize_file(root / SHARD1, tmp_path / "q.safetensors", fmt="MXFP8", checkpoint_format="FP4REF")
    assert {r.fmt for r in reps if r.action == "quantized"} == {"mxfp8"}
    with safe_open(str(tmp_path / "q.safetensors"), framework="np") as h:
        meta = h.metadata()
    assert (meta["fp4ref.format"], meta["fp4ref.checkpoint_format"]) == ("mxfp8", "fp4ref")
    with pytest.raises(C.QuantizeFileError, match=r"^fmt='nvfp8' \(--format\) is not one of \['nvfp4', 'mxfp4', "
                                                  r"'mxfp8'\]$"):
        C.quantize_checkpoint(root, None, fmt="nvfp8", dry_run=True)
    with pytest.raises(C.QuantizeFileError, match=r"^checkpoint_format='vllm' \(--checkpoint-format\) is not one of "
                                                  r"\['fp4ref', 'modelopt', 'compressed-tensors'\]$"):
        C.quantize_checkpoint(root, None, checkpoint_format="vllm", dry_run=True)
    with pytest.raises(TypeError, match=r"^fmt=4 \(--format\): expected one of \['nvfp4', 'mxfp4', 'mxfp8'\] \(a "
                                        r"str, any case\), got int$"):
        C.quantize_checkpoint(root, None, fmt=4, dry_run=True)
    with pytest.raises(TypeError, match=r"^checkpoint_format=None \(--checkpoint-format\): expected one of "):
        C.quantize_checkpoint(root, None, checkpoint_format=None, dry_run=True)
    assert _listing(tmp_path) == ["q.safetensors"]
