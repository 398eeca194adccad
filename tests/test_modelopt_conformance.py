"""Every NVFP4 weight fp4ref writes in the ModelOpt layout has the bytes of NVIDIA ModelOpt's own quantizer
(nvidia-modelopt 0.47.0, ``NVFP4QTensor`` in modelopt/torch/quantization/qtensor/nvfp4_tensor.py) called the way its
unified HF export calls it (export/unified_export_hf.py, export/quant_utils.py): weight_scale_2 = amax / (6 * 448)
with the amax shared by fused layers (``preprocess_linear_fusion``) and per expert for 3-D expert tensors;
weight_scale = ``get_weights_scaling_factor``; weight = ``quantize(...)[0]._quantized_data``.

Skipped where modelopt (and torch) are not installed.
"""
from __future__ import annotations

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
        base = name[: -len("weight")] if name.endswith(".weight") else name + "_"
        np.testing.assert_array_equal(_stored(out, base + "weight"), packed.numpy(), err_msg=name)
        np.testing.assert_array_equal(_stored(out, base + "weight_scale"), scale.view(torch.uint8).numpy(),
                                      err_msg=name)
        np.testing.assert_array_equal(_stored(out, base + "weight_scale_2").view(np.float32).reshape(sf2.shape),
                                      sf2.numpy(), err_msg=name)
        checked += 1
    assert checked == 4 + 2 + 12 + 2  # q k v o, gate up, 12 per-expert Linear weights, 2 3-D expert tensors
