"""Smoke test of the codec benchmark (fp4ref.bench.codecs): it runs, prints the table, and its data is not trivial."""
from __future__ import annotations

import numpy as np

from fp4ref.bench import codecs as bench_codecs
from fp4ref.formats import FORMATS, encode


def test_bench_codecs_main_prints_table(capsys):
    assert bench_codecs.main(["--n", "8192", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "Command: `python -m fp4ref.bench.codecs --n 8192 --repeat 1`" in out
    for name in FORMATS:
        assert f"| {name} | encode |" in out and f"| {name} | decode |" in out


def test_bench_data_exercises_the_whole_range():
    for fmt in FORMATS.values():
        x = bench_codecs.make_data(fmt, 1 << 16, seed=1)
        assert x.dtype == np.float32 and np.count_nonzero(x) == x.size
        codes = encode(x, fmt)
        assert np.unique(codes).size >= min(1 << fmt.nbits, 200) // 2, fmt.name  # many distinct codes
        if fmt.signed:
            assert np.any(np.abs(x) > fmt.max) and np.any(np.abs(x) < fmt.min_normal)
