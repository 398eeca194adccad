"""Smoke test of the NVFP4 quantization benchmark (fp4ref.bench.quantize): it runs and prints the table."""
from __future__ import annotations

from fp4ref.bench import quantize as bench_quantize


def test_bench_quantize_main_prints_table(capsys):
    assert bench_quantize.main(["--rows", "64", "--cols", "128", "--repeat", "1", "--recipes", "te,sol"]) == 0
    out = capsys.readouterr().out
    assert "Command: `python -m fp4ref.bench.quantize --rows 64 --cols 128 --repeat 1 --recipes te,sol`" in out
    assert "| te |" in out and "| sol |" in out and "| torchao |" not in out
    results, _ = bench_quantize.run(32, 64, ["exact"], 1, 0)
    (recipe, t, peak, t_peer, peak_peer), = results
    assert recipe == "exact" and t > 0 and t_peer > 0 and peak > 0 and peak_peer > 0
