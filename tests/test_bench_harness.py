"""kernels/_bench.py's CUPTI figure: a call's GPU span (first kernel start to last kernel end), the method of
FlashInfer's bench_gpu_time, not the sum of its kernels' durations."""
from __future__ import annotations

import pytest

from fp4ref.kernels._bench import Timing, call_span_us, idle_inside


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



def test_idle_inside_flags_a_call_the_host_could_not_keep_fed():
    # nvfp4_linear at M = 4 on a loaded host: span 77 us over 23.6 us of kernels
    assert idle_inside(Timing(cupti_us=77.0, event_us=94.4, kernels=3, kernel_sum_us=23.6))
    assert not idle_inside(Timing(cupti_us=23.1, event_us=25.9, kernels=2, kernel_sum_us=21.9))  # a launch gap
    assert not idle_inside(Timing(cupti_us=21.7, event_us=26.9, kernels=2, kernel_sum_us=27.9))  # PDL overlap
