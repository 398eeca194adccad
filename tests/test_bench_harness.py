"""kernels/_bench.py's CUPTI figure: a call's GPU span (first kernel start to last kernel end), the method of
FlashInfer's bench_gpu_time, not the sum of its kernels' durations."""
from __future__ import annotations

import pytest

from fp4ref.kernels._bench import call_span_us


def test_span_counts_gaps_and_overlap_once():
    assert call_span_us([(10.0, 12.5)]) == 2.5
    assert call_span_us([(10.0, 12.0), (13.0, 20.0)]) == 10.0  # the 1 us gap between two kernels counts
    assert call_span_us([(13.0, 20.0), (10.0, 15.0)]) == 10.0  # overlapping kernels (PDL) count once, any order
    assert call_span_us([(10.0, 30.0), (12.0, 14.0)]) == 20.0  # a kernel inside another adds nothing


def test_span_rejects_bad_intervals():
    with pytest.raises(ValueError, match="no kernel intervals"):
        call_span_us([])
    with pytest.raises(ValueError, match="ends before it starts"):
        call_span_us([(10.0, 9.0)])

