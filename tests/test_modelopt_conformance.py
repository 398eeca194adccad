"""Every NVFP4 weight fp4ref writes in the ModelOpt layout has the bytes of NVIDIA ModelOpt's own quantizer
(nvidia-modelopt 0.47.0, ``NVFP4QTensor`` in modelopt/torch/quantization/qtensor/nvfp4_tensor.py) called the way its
unified HF export calls it (export/unified_export_hf.py, export/quant_utils.py): weight_scale_2 = amax / (6 * 448)
with the amax shared by fused layers (``preprocess_linear_fusion``) and per expert for 3-D expert tensors;
weight_scale = ``get_weights_scaling_factor``; weight = ``quantize(...)[0]._quantized_data``.

Skipped where modelopt (and torch) are not installed.
"""
from __future__ import annotations

import functools
import json

import numpy as np
import pytest

from fp4ref import checkpoint as C

from _checkpoints import DOWN72, IGNORED, group_of, make_checkpoint

modelopt = pytest.importorskip("modelopt")
torch = pytest.importorskip("torch")


def _torch_bf16(x: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(x).view(np.uint16).astype(np.int16)).view(torch.bfloat16)


def _stored(out, name: str) -> np.ndarray:
    """The stored bytes of tensor ``name`` (uint8, the tensor's shape for byte-sized dtypes, else flat)."""
    from safetensors import safe_open

    index = json.loads((out / "model.safetensors.index.json").read_text())
    path = out / index["weight_map"][name]
    with safe_open(str(path), framework="np") as f:
        info = f.get_slice(name)
        shape = tuple(info.get_shape())
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    b, e = json.loads(data[8: 8 + n])[name]["data_offsets"]
    raw = np.frombuffer(data[8 + n + b: 8 + n + e], np.uint8)
    return raw.reshape(shape) if raw.size == int(np.prod(shape)) else raw


@functools.lru_cache(maxsize=None)
def _export_names(attr: str) -> tuple:
    """(codes, scale, global scale) attribute names ModelOpt's own export (``_export_quantized_weight``) gives an
    NVFP4 parameter ``attr`` of a module: run on a small module and read back from its state dict."""
    from modelopt.torch.export.unified_export_hf import _export_quantized_weight
    from modelopt.torch.quantization.config import QuantizerAttributeConfig
    from modelopt.torch.quantization.nn import TensorQuantizer

    m = torch.nn.Module()
    w = torch.linspace(-1.0, 1.0, 16 * 32).reshape(16, 32).to(torch.bfloat16)
    setattr(m, attr, torch.nn.Parameter(w, requires_grad=False))
    q = TensorQuantizer(QuantizerAttributeConfig(num_bits=(2, 1), block_sizes={-1: 16, "type": "dynamic",
                                                                               "scale_bits": (4, 3)}))
    q.amax = w.float().abs().amax()
    setattr(m, "weight_quantizer" if attr == "weight" else attr + "_weight_quantizer", q)
    _export_quantized_weight(m, torch.bfloat16, attr)
    by_dtype = {v.dtype: k for k, v in m.state_dict().items() if "_quantizer" not in k}
    assert len(by_dtype) == 3, m.state_dict().keys()
    return by_dtype[torch.uint8], by_dtype[torch.float8_e4m3fn], by_dtype[torch.float32]


def _modelopt_names(name: str) -> tuple:
    """(codes, scale, global scale) tensor names ModelOpt's export gives the quantized parameter ``name``."""
    module, attr = name.rsplit(".", 1)
    return tuple(f"{module}.{a}" for a in _export_names(attr))


def test_modelopt_export_names_parameters():
    """ModelOpt's export keeps a parameter P's own name for the codes (P, P_weight_scale, P_weight_scale_2; X.weight,
    X.weight_scale, X.weight_scale_2); fp4ref's output_names, which its writer and readers use, gives the same."""
    assert _export_names("weight") == ("weight", "weight_scale", "weight_scale_2")
    assert _export_names("gate_up_proj") == ("gate_up_proj", "gate_up_proj_weight_scale",
                                             "gate_up_proj_weight_scale_2")
    for name in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj.weight"):
        on = C.output_names("modelopt", "nvfp4", name)
        assert (on["codes"], on["scale"], on["global"]) == _modelopt_names(name)


def test_modelopt_layout_bytes_equal_modelopt_nvfp4qtensor(tmp_path):
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    tensors = make_checkpoint(tmp_path / "in")
    out = tmp_path / "out"
    reports = C.quantize_checkpoint(tmp_path / "in", out, checkpoint_format="modelopt", recipe="modelopt")
    quantized = {r.name for r in reports if r.action == "quantized"}
    assert quantized == set(tensors) - set(IGNORED) - {DOWN72}
    checked = 0
    for name, x in tensors.items():
        if name not in quantized:
            continue
        w = _torch_bf16(x)
        if x.ndim == 2:
            amax = max(_torch_bf16(tensors[m]).abs().amax().float() for m in group_of(name))
            sf2 = amax / (6.0 * 448.0)
            sf2_q = sf2
        else:  # 3-D expert tensor [E, N, K]: one amax per expert
            sf2 = w.abs().amax(dim=(1, 2)).float() / (6.0 * 448.0)
            sf2_q = sf2.view(-1, 1, 1)
        scale = NVFP4QTensor.get_weights_scaling_factor(w, 16, sf2_q)[0]
        packed = NVFP4QTensor.quantize(w, 16, scale, sf2_q)[0]._quantized_data
        codes, scale_name, global_name = _modelopt_names(name)
        np.testing.assert_array_equal(_stored(out, codes), packed.numpy(), err_msg=name)
        np.testing.assert_array_equal(_stored(out, scale_name), scale.view(torch.uint8).numpy(), err_msg=name)
        np.testing.assert_array_equal(_stored(out, global_name).view(np.float32).reshape(sf2.shape),
                                      sf2.numpy(), err_msg=name)
        checked += 1
    assert checked == 4 + 2 + 12 + 2  # q k v o, gate up, 12 per-expert Linear weights, 2 3-D expert tensors


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_modelopt_qtensors_decode_the_stored_bytes_as_fp4ref_does(tmp_path, fmt):
    """Read back: ModelOpt's own NVFP4QTensor / MXFP8QTensor ``dequantize`` of each stored 2-D layer (codes, block
    scales, weight_scale_2), in float64 where every product is exact, equals fp4ref's exact decode
    (``read_dequantized``) value for value. The one difference is the sign of zero: ModelOpt's E2M1 table decodes
    code 0x8 as +0, fp4ref as -0 (E2M1's -0; a bf16 / fp16 weight keeps it)."""
    from modelopt.torch.quantization.qtensor import MXFP8QTensor, NVFP4QTensor

    tensors = make_checkpoint(tmp_path / "in")
    out = tmp_path / "out"
    reports = C.quantize_checkpoint(tmp_path / "in", out, fmt=fmt, checkpoint_format="modelopt")
    names = [r.name for r in reports if r.action == "quantized" and tensors[r.name].ndim == 2]
    assert len(names) == 4 + 2 + 12
    negative_zeros = 0
    for name in names:
        codes, scale_name, global_name = _modelopt_names(name)
        w, s = torch.from_numpy(_stored(out, codes).copy()), torch.from_numpy(_stored(out, scale_name).copy())
        exact = C.read_dequantized(out, name)
        if fmt == "nvfp4":
            g = torch.from_numpy(_stored(out, global_name).view(np.float32).copy()).double()
            q = NVFP4QTensor(torch.Size(exact.shape), torch.float64, w)
            got = q.dequantize(dtype=torch.float64, scale=s.view(torch.float8_e4m3fn).double(), double_scale=g,
                               block_sizes={-1: 16}).numpy()
        else:
            q = MXFP8QTensor(torch.Size(exact.shape), torch.float64, w.view(torch.float8_e4m3fn))
            got = q.dequantize(dtype=torch.float64, scale=s).numpy()
        np.testing.assert_array_equal(got, exact, err_msg=name)  # (0.0 == -0.0)
        sign = np.signbit(got) != np.signbit(exact)
        assert not sign.any() or (fmt == "nvfp4" and (exact[sign] == 0).all() and np.signbit(exact[sign]).all())
        negative_zeros += int(sign.sum())
    assert (negative_zeros > 0) == (fmt == "nvfp4")  # a -0 weight is quantized to code 0x8 somewhere
