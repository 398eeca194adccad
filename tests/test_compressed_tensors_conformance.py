"""The compressed-tensors checkpoints fp4ref writes, read by compressed-tensors 0.20.1 itself (the library vLLM's
compressed-tensors loader is built on) and by transformers 5.25's compressed-tensors integration.

A small Llama-shaped checkpoint (random bf16 weights, rows of widely different scales) is quantized in the
compressed-tensors layout; compressed-tensors' checkpoint dequantizer (``CompressedTensorsDequantizer``, which runs
each format's compressor ``decompress``) must claim every tensor and give fp4ref's bf16 decode:

* MXFP4, MXFP8: bit for bit (element x 2^(scale - 127) is exact in bf16).
* NVFP4: compressed-tensors rounds three times (fp32 scale / global encode scale, fp32 product with the E2M1 value,
  then bf16; quantization/lifecycle/forward_helpers.py), fp4ref once from the exact value. They may differ only by
  one bf16 step, only where the exact value lies within those three fp32 roundings (2^-22 relative) of a bf16
  midpoint, and on under 1% of the elements; fp4ref's value is the correctly rounded one (tests/test_checkpoint.py
  checks --dequantize against exact arithmetic).

transformers then loads each checkpoint (dequantized at load), holds compressed-tensors' weights and runs a forward
pass. And it has no loader for the modelopt layout (docs/checkpoints.md says so; a test here notices when that
changes). Skipped where compressed-tensors, transformers or torch is not installed.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from fp4ref.checkpoint import dequantize_checkpoint, quantize_checkpoint, read_dequantized

torch = pytest.importorskip("torch")
pytest.importorskip("compressed_tensors")
transformers = pytest.importorskip("transformers")

HIDDEN, INTER, LAYERS = 64, 128, 2


def _llama(root) -> None:
    """A Llama-shaped bf16 checkpoint: 14 projection weights whose rows' scales span ~e^+-4, norms, embeddings."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    shapes = {"model.embed_tokens.weight": (256, HIDDEN), "lm_head.weight": (256, HIDDEN),
              "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
                   **{p + f"self_attn.{x}_proj.weight": (HIDDEN if x in "qo" else 32, HIDDEN) for x in "qkvo"},
                   p + "mlp.gate_proj.weight": (INTER, HIDDEN), p + "mlp.up_proj.weight": (INTER, HIDDEN),
                   p + "mlp.down_proj.weight": (HIDDEN, INTER)}
    t = {n: (torch.ones(s) if len(s) == 1 else torch.randn(s, generator=g) * 0.02
             * torch.exp(1.5 * torch.randn(s[0], 1, generator=g))).to(torch.bfloat16) for n, s in shapes.items()}
    root.mkdir()
    save_file(t, str(root / "model.safetensors"), metadata={"format": "pt"})
    (root / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTER, "num_hidden_layers": LAYERS, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 256, "tie_word_embeddings": False, "dtype": "bfloat16"}))


@pytest.mark.filterwarnings("ignore:You passed `quantization_config`:UserWarning")
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_compressed_tensors_reads_what_fp4ref_writes(tmp_path, fmt):
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import CompressedTensorsDequantizer
    from safetensors.torch import load_file

    src, out, deq = tmp_path / "src", tmp_path / "q", tmp_path / "deq"
    _llama(src)
    reports = quantize_checkpoint(src, out, fmt=fmt, checkpoint_format="compressed-tensors")
    quantized = sorted(r.name for r in reports if r.action == "quantized")
    assert len(quantized) == 7 * LAYERS and all(n.endswith("_proj.weight") for n in quantized)
    dequantize_checkpoint(out, deq, dtype="bfloat16")
    ours = load_file(str(deq / "model.safetensors"))
    # validate() raises if a tensor of the checkpoint is left unclaimed by the compressors
    theirs = CompressedTensorsDequantizer(out, dtype=torch.bfloat16).validate(load_file(str(out / "model.safetensors")))
    assert theirs.keys() == ours.keys()
    off_by_one = elements = 0
    for name, ref in ours.items():
        a, b = theirs[name].view(torch.int16), ref.view(torch.int16)
        if fmt != "nvfp4" or name not in quantized:
            assert torch.equal(a, b), name
            continue
        d = a != b
        off_by_one, elements = off_by_one + int(d.sum()), elements + d.numel()
        assert ((a[d].int() - b[d].int()).abs() == 1).all(), name  # one bf16 step (same sign, finite values)
        # compressed-tensors' fp32 product lands on the midpoint of the two bf16 neighbours: three fp32 roundings
        # (each <= 2^-24 relative) from the exact value, so it lies within 2^-22 of it
        exact = read_dequantized(out, name)[d.numpy()]  # float64, exact
        mid = ((theirs[name][d].double() + ref[d].double()) / 2).numpy()
        assert (np.abs(exact - mid) <= np.abs(exact) * 2.0**-22).all(), name
    if fmt == "nvfp4":  # (docs/checkpoints.md says so)
        assert 0 < off_by_one < 0.01 * elements, (off_by_one, elements)

    model = transformers.AutoModelForCausalLM.from_pretrained(
        out, quantization_config=transformers.CompressedTensorsConfig(dequantize=True))
    sd = model.state_dict()
    assert all(torch.equal(sd[n], theirs[n]) for n in quantized)
    with torch.no_grad():
        logits = model(torch.arange(8)[None]).logits
    assert logits.shape == (1, 8, 256) and torch.isfinite(logits).all()


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_transformers_has_no_loader_for_the_modelopt_layout(tmp_path, fmt):
    """docs/checkpoints.md tells users not to load the modelopt layout with transformers: 5.25.0 treats its
    quant_method as unknown and loads the tensors unquantized, so NVFP4's packed [N, K/2] weights fail on their
    shape and MXFP8's E4M3 values load unscaled as the weights. A transformers release with a loader fails this."""
    from safetensors.torch import load_file

    src, out = tmp_path / "src", tmp_path / "q"
    _llama(src)
    quantize_checkpoint(src, out, fmt=fmt, checkpoint_format="modelopt")
    if fmt == "nvfp4":
        with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
            transformers.AutoModelForCausalLM.from_pretrained(out)
        return
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    name = "model.layers.0.self_attn.q_proj.weight"
    stored = load_file(str(out / "model.safetensors"))[name]  # float8_e4m3fn values, their scales left out
    assert torch.equal(model.state_dict()[name], stored.to(torch.bfloat16))
