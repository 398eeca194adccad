"""Checkpoint quantization benchmark: ``fp4ref quantize`` (ModelOpt NVFP4 layout) on a synthetic multi-GiB bf16
checkpoint with ``--jobs 1`` and ``--jobs 2``, beside plain safetensors reading and writing the same bytes.

Run ``python -m fp4ref.bench.checkpoint [--size-gib 2] [--jobs 1 2] [--dir DIR]``. Not a test: it prints a Markdown
table for docs/benchmarks.md. Each case runs in a fresh interpreter, which reports its wall time, its own peak RSS
(VmHWM) and the largest peak RSS of its worker processes (``ru_maxrss`` of RUSAGE_CHILDREN; workers are forked
from the case's process, so theirs includes the pages they share with it). The synthetic
checkpoint is Llama-shaped (hidden 4096, MLP 8192, 1024-wide k/v; embeddings and lm_head 16384 x 4096 stay bf16, as
the default ignore list keeps them), split into ~1 GiB shards with an index; the input is read once before the
cases so every case reads it from the page cache.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

H, INTER, KV, VOCAB = 4096, 8192, 1024, 16384


def _layer_shapes(i: int) -> dict:
    p = f"model.layers.{i}."
    return {p + "self_attn.q_proj.weight": (H, H), p + "self_attn.k_proj.weight": (KV, H),
            p + "self_attn.v_proj.weight": (KV, H), p + "self_attn.o_proj.weight": (H, H),
            p + "mlp.gate_proj.weight": (INTER, H), p + "mlp.up_proj.weight": (INTER, H),
            p + "mlp.down_proj.weight": (H, INTER), p + "input_layernorm.weight": (H,)}


def make_checkpoint(root: Path, size_gib: float, seed: int = 0) -> dict:
    """Write the synthetic checkpoint; returns {"bytes", "weights" (elements), "quantized_weights", "largest"}."""
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    per_layer = sum(int(np.prod(s)) for s in _layer_shapes(0).values()) * 2
    layers = max(1, round((size_gib * 2**30 - 2 * VOCAB * H * 2) / per_layer))
    shapes = {"model.embed_tokens.weight": (VOCAB, H)}
    for i in range(layers):
        shapes.update(_layer_shapes(i))
    shapes.update({"model.norm.weight": (H,), "lm_head.weight": (VOCAB, H)})
    root.mkdir(parents=True, exist_ok=True)
    shard, shard_bytes, files, weight_map = {}, 0, [], {}

    def flush():
        nonlocal shard, shard_bytes
        name = f"model-{len(files) + 1:05d}.safetensors"
        save_file(shard, str(root / name), metadata={"format": "pt"})
        files.append(name)
        weight_map.update({n: name for n in shard})
        shard, shard_bytes = {}, 0

    for n, s in shapes.items():
        shard[n] = (rng.standard_normal(s, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)
        shard_bytes += shard[n].nbytes
        if shard_bytes >= 2**30:
            flush()
    if shard:
        flush()
    total = sum(int(np.prod(s)) for s in shapes.values())
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 2 * total},
                                                                   "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"}))
    quantized = sum(int(np.prod(s)) for n, s in shapes.items() if ".layers." in n and len(s) == 2)
    largest = max((s for n, s in shapes.items() if ".layers." in n), key=lambda s: int(np.prod(s)))
    return {"bytes": 2 * total, "weights": total, "quantized_weights": quantized, "largest": list(largest),
            "layers": layers, "shards": len(files)}


def _case(args) -> int:
    """Run one case in this (fresh) process and print its JSON measurement."""
    t0 = time.perf_counter()
    if args.case == "baseline":
        from safetensors.numpy import load_file, save_file

        out = Path(args.out)
        out.mkdir()
        for f in sorted(Path(args.input).glob("*.safetensors")):
            save_file(load_file(str(f)), str(out / f.name), metadata={"format": "pt"})
    else:
        from ..checkpoint import quantize_checkpoint

        quantize_checkpoint(args.input, args.out, checkpoint_format="modelopt", jobs=args.jobs, progress=False)
    secs = time.perf_counter() - t0
    me = _own_peak_rss_mib()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"seconds": secs, "rss_mib": me, "worker_rss_mib": kids}))
    return 0


def _own_peak_rss_mib() -> float:
    """This process's peak RSS: VmHWM (Linux; per address space, so it does not carry over the RSS of the process
    that forked and exec'd us, as ``ru_maxrss`` does), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run_case(case: str, inp: Path, out: Path, jobs: int = 1) -> dict:
    cmd = [sys.executable, "-m", "fp4ref.bench.checkpoint", "--case", case, "--input", str(inp), "--out", str(out),
           "--jobs", str(jobs)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    """Make the checkpoint, run the cases, print the Markdown table. Returns 0."""
    p = argparse.ArgumentParser(prog="python -m fp4ref.bench.checkpoint", description=__doc__.splitlines()[0])
    p.add_argument("--size-gib", type=float, default=2.0, help="checkpoint size in GiB of bf16 (default 2)")
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 2], help="--jobs values to run (default 1 2)")
    p.add_argument("--dir", default=None, help="working directory (default: a temporary one, removed at the end)")
    p.add_argument("--case", choices=("baseline", "quantize"), help=argparse.SUPPRESS)
    p.add_argument("--input", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        args.jobs = args.jobs[0]
        return _case(args)
    if args.size_gib <= 0 or any(j < 1 for j in args.jobs):
        p.error("--size-gib must be > 0 and every --jobs value >= 1")
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="fp4ref-bench-ckpt-"))
    try:
        inp = work / "in"
        info = make_checkpoint(inp, args.size_gib)
        for f in inp.iterdir():  # warm the page cache: every case reads cached input
            with open(f, "rb") as h:
                while h.read(64 << 20):
                    pass
        rows = [("safetensors load_file + save_file", 1, _run_case("baseline", inp, work / "out"))]
        for j in args.jobs:
            rows.append((f"fp4ref quantize --checkpoint-format modelopt", j, _run_case("quantize", inp, work / "out",
                                                                                      j)))
        from .codecs import machine_line

        largest_out = info["largest"][0] * info["largest"][1] // 2 / 2**20
        print(f"Checkpoint: {info['bytes'] / 2**30:.2f} GiB bf16, {info['weights'] / 1e9:.3f} G weights "
              f"({info['quantized_weights'] / 1e9:.3f} G quantized), {info['layers']} layers, {info['shards']} "
              f"shards; largest quantized tensor {info['largest']} (output {largest_out:.0f} MiB packed)")
        print(f"Machine: {machine_line()}\n")
        print("| case | --jobs | wall s | input GiB/s | weights/s (M) | vs read+write | peak RSS main MiB | "
              "peak RSS per worker MiB |")
        print("|---|---|---|---|---|---|---|---|")
        base = rows[0][2]["seconds"]
        for name, j, r in rows:
            print(f"| {name} | {j if 'fp4ref' in name else '-'} | {r['seconds']:.1f} | "
                  f"{info['bytes'] / 2**30 / r['seconds']:.3f} | {info['weights'] / r['seconds'] / 1e6:.1f} | "
                  f"{base / r['seconds']:.0%} | {r['rss_mib']:.0f} | "
                  f"{r['worker_rss_mib']:.0f} |" if j > 1 else
                  f"| {name} | {j if 'fp4ref' in name else '-'} | {r['seconds']:.1f} | "
                  f"{info['bytes'] / 2**30 / r['seconds']:.3f} | {info['weights'] / r['seconds'] / 1e6:.1f} | "
                  f"{base / r['seconds']:.0%} | {r['rss_mib']:.0f} | - |")
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
