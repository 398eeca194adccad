"""A small Llama-like checkpoint for the checkpoint tests: bf16, 2 shards + model.safetensors.index.json,
config.json and a tokenizer file; fused q/k/v and gate/up; a MoE layer with a router, per-expert Linear weights
(experts.E.{gate,up,down}_proj.weight) and 3-D expert tensors (experts.gate_up_proj [E, 2I, H], experts.down_proj
[E, H, I], the [experts, out, in] layout); an MLP width (72) that is not a multiple of 16 (down_proj's K)."""
from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

H, I, E, V, IE = 64, 72, 4, 48, 32
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
QKV = [f"model.layers.0.self_attn.{m}_proj.weight" for m in "qkv"]
GATE_UP = ["model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"]
IGNORED = ["lm_head.weight", "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
           "model.layers.1.mlp.gate.weight", "model.norm.weight"]
DOWN72 = "model.layers.0.mlp.down_proj.weight"  # K = 72: not a multiple of 16 or 32
EXPERTS_3D = ["model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"]


def make_checkpoint(root, seed: int = 0) -> dict:
    """Write the checkpoint into directory ``root`` (created) and return {name: bf16 array}."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    def bf(*shape, sc=0.05):
        return (rng.standard_normal(shape) * sc).astype(ml_dtypes.bfloat16)

    s1 = {
        "model.embed_tokens.weight": bf(V, H),
        "model.layers.0.input_layernorm.weight": bf(H, sc=1.0),
        QKV[0]: bf(H, H), QKV[1]: bf(32, H, sc=0.2), QKV[2]: bf(32, H),
        "model.layers.0.self_attn.o_proj.weight": bf(H, H),
        GATE_UP[0]: bf(I, H), GATE_UP[1]: bf(I, H, sc=0.3),
        "model.layers.0.mlp.down_proj.weight": bf(H, I),
    }
    s1[QKV[2]][5, 16:32] = 0  # one all-zero block
    s2 = {
        "model.layers.1.mlp.gate.weight": bf(E, H),
        "model.norm.weight": bf(H, sc=1.0),
        "lm_head.weight": bf(V, H),
        EXPERTS_3D[0]: bf(E, 2 * IE, H),
        EXPERTS_3D[1]: bf(E, H, IE),
    }
    s2[EXPERTS_3D[0]][2] *= 8  # one expert with a much larger range: per-expert global scales differ
    for e in range(E):
        s2[f"model.layers.1.mlp.experts.{e}.gate_proj.weight"] = bf(IE, H)
        s2[f"model.layers.1.mlp.experts.{e}.up_proj.weight"] = bf(IE, H, sc=0.1 * (e + 1))
        s2[f"model.layers.1.mlp.experts.{e}.down_proj.weight"] = bf(H, IE)
    save_file(s1, str(root / SHARD1), metadata={"format": "pt"})
    save_file(s2, str(root / SHARD2), metadata={"format": "pt"})
    weight_map = {n: SHARD1 for n in s1} | {n: SHARD2 for n in s2}
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1},
                                                                   "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16",
                                                  "hidden_size": H, "intermediate_size": I}))
    (root / "tokenizer.json").write_text('{"version": "1.0"}')
    return {**s1, **s2}


def fused_groups() -> list:
    """Lists of tensor names that must share one NVFP4 global scale."""
    groups = [QKV, GATE_UP]
    for e in range(E):
        groups.append([f"model.layers.1.mlp.experts.{e}.gate_proj.weight",
                       f"model.layers.1.mlp.experts.{e}.up_proj.weight"])
    return groups


def group_of(name: str) -> list:
    return next((g for g in fused_groups() if name in g), [name])
