"""The one benchmark harness of the fp4ref kernels: CUPTI GPU time, CUDA-event time, tables.

Headline figure (``time_gpu(...).cupti_us``): GPU time per call by CUPTI, the method of FlashInfer's
``bench_gpu_time`` that the workloads' public benchmarks use: torch.profiler with CUDA activity records every
kernel; a call's time is its GPU span, from the start of its first kernel to the end of its last (so the gaps
between a call's kernels count, and kernels that overlap count once); the L2 is flushed before every call by a
write of 2 x the L2 size (its kernel excluded); 10 warm-up and 50 timed calls; the median. ``kernel_sum_us``
beside it is the sum of the call's kernel durations (gaps left out). ``event_us``: CUDA events around each call
(same flush, same counts), which includes what host launch time costs when the host is slower than the GPU.
Always time the peer in the same run and print both columns.

Nothing runs at import; torch is imported lazily so ``--help`` works without a GPU.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

__all__ = ["Timing", "call_span_us", "idle_inside", "time_gpu", "host_us_per_call", "l2_flush_buffer",
           "flush_l2_cache", "time_cuda", "gpu_time_graph", "print_table", "geomean", "compile_in_pool"]

_FLUSH_BUFFERS: dict = {}


def l2_flush_buffer(device=None):
    """Return a cached int8 CUDA buffer of 2 x the device's L2 size (bytes); writing it evicts L2.

    Falls back to 2 x 64 MiB when torch does not report the L2 size (an upper estimate for Hopper's 50 MiB L2).
    """
    import torch

    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    key = str(dev)
    buf = _FLUSH_BUFFERS.get(key)
    if buf is None:
        props = torch.cuda.get_device_properties(dev)
        l2 = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
        buf = torch.empty(2 * l2, dtype=torch.int8, device=dev)
        _FLUSH_BUFFERS[key] = buf
    return buf


def flush_l2_cache(device=None) -> None:
    """Evict the L2: one kernel that reads and writes the 2 x L2 buffer in place (bitwise NOT of int8), which
    leaves the L2 full of dirty lines of the buffer, as the public benchmarks' zero-fill does. Its kernel name
    ("bitwise_not", launched by nothing else here) is what ``time_gpu`` leaves out of a call's CUPTI time and
    uses to tell the calls apart; a zero-fill would be confused with the fills a call launches itself."""
    import torch

    buf = l2_flush_buffer(device)
    torch.bitwise_not(buf, out=buf)


_FLUSH_KERNEL = "bitwise_not"


@dataclass(frozen=True)
class Timing:
    """One benchmark measurement, in MICROSECONDS per call (medians)."""

    cupti_us: float  # GPU time (CUPTI): first kernel start to last kernel end of the call, L2 flush excluded
    event_us: float  # CUDA events around the call (host launch time included when it exceeds the GPU time)
    kernels: int  # kernels per call (median over the timed calls)
    kernel_sum_us: float = float("nan")  # the sum of the call's kernel durations (CUPTI; gaps left out)


def time_gpu(fn: Callable[[], Any], warmup: int = 10, iters: int = 50, flush: bool = True) -> Timing:
    """Time ``fn()`` by CUPTI (torch.profiler) and by CUDA events; L2 flushed before every call (module docstring).

    Raises:
        ValueError: ``warmup`` < 0 or ``iters`` < 1.
        RuntimeError: no CUDA device, or the profiler recorded no kernel for some call.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    event_us = time_cuda(fn, warmup=warmup, iters=iters, flush_l2=flush)
    for _ in range(warmup):
        if flush:
            flush_l2_cache()
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            flush_l2_cache()  # always: the flush kernels delimit the calls in the trace
            fn()
        torch.cuda.synchronize()
    # every device activity (kernels, and the memcpy / memset a call may issue) counts as the call's GPU time
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    calls: list = []  # per call: (start, end) of each of its kernels, microseconds
    for e in kernels:
        if _FLUSH_KERNEL in e.name:
            calls.append([])
        elif calls:
            calls[-1].append((e.time_range.start, e.time_range.end))
    if len(calls) != iters or not all(calls):
        raise RuntimeError(f"CUPTI trace: expected {iters} calls with >= 1 kernel each, got "
                           f"{[len(c) for c in calls][:8]}... ({len(calls)} calls)")
    return Timing(cupti_us=statistics.median(call_span_us(c) for c in calls), event_us=event_us,
                  kernels=int(statistics.median(len(c) for c in calls)),
                  kernel_sum_us=statistics.median(sum(e - s for s, e in c) for c in calls))


def idle_inside(t: Timing, tolerance: float = 0.25) -> bool:
    """Whether the GPU idled inside the call: its span exceeds the sum of its kernel durations by more than
    ``tolerance`` of that sum. Launch gaps between dependent kernels are ~1 us; a larger gap means the host did
    not keep ahead of the GPU (a loaded host machine), and the span then measures the host, not the kernels."""
    return t.cupti_us > (1.0 + tolerance) * t.kernel_sum_us


def call_span_us(intervals: Sequence[tuple[float, float]]) -> float:
    """GPU span of one call: the last end minus the first start of its kernels' (start, end) intervals, in the
    intervals' unit. Raises ValueError on no intervals or an interval that ends before it starts."""
    if not intervals:
        raise ValueError("call_span_us: no kernel intervals")
    if any(e < s for s, e in intervals):
        raise ValueError(f"call_span_us: an interval ends before it starts: {list(intervals)}")
    return max(e for _, e in intervals) - min(s for s, _ in intervals)


def time_cuda(fn: Callable[[], Any], warmup: int = 10, iters: int = 50, flush_l2: bool = True) -> float:
    """Median time of ``fn()`` on the current CUDA stream, in MICROSECONDS.

    Each timed iteration: write the L2 flush buffer (outside the timed region), record a start event, call
    ``fn()``, record an end event. ``warmup`` untimed calls come first (each after a flush too). Returns the
    median over ``iters`` of the event-measured times.

    Raises:
        ValueError: ``warmup`` < 0 or ``iters`` < 1.
        RuntimeError: CUDA is not available.
    """
    import torch

    if warmup < 0:
        raise ValueError(f"warmup={warmup}: expected >= 0")
    if iters < 1:
        raise ValueError(f"iters={iters}: expected >= 1")
    if not torch.cuda.is_available():
        raise RuntimeError("time_cuda needs a CUDA device; torch.cuda.is_available() is False")
    for _ in range(warmup):
        if flush_l2:
            flush_l2_cache()
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        if flush_l2:
            flush_l2_cache()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))


def host_us_per_call(fn: Callable[[], Any], calls: int = 200) -> float:
    """CPU time per call of ``fn`` in MICROSECONDS: the wall clock of ``calls`` back-to-back calls (launches
    queued, no synchronisation inside the loop) divided by ``calls``, after 10 warm-up calls."""
    import time

    import torch

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def gpu_time_graph(fn: Callable[[], Any], reps: int = 20, replays: int = 5,
                   flush: Callable[[], Any] | None = None) -> float:
    """GPU-only time of ``fn()`` with L2 flushed, in MICROSECONDS, free of host launch overhead (DIAGNOSTIC).

    Captures two CUDA graphs: ``reps`` x (flush, fn) and ``reps`` x flush; times ``replays`` replays of each with
    CUDA events and returns (median(both) - median(flush)) / reps. This separates what the GPU spends in ``fn``
    from the CPU time a launch costs, which the public-benchmark timing (``time_cuda``: no graphs) includes
    whenever the host is slower than the flush. Not the reported methodology: report ``time_cuda``.
    ``fn`` must be capturable (no synchronisation, no host reads); call it once before (warm-up, allocations).
    ``flush``: the capturable L2 flush to use; default ``flush_l2_cache`` (the flush of ``time_gpu``).
    """
    import torch

    if flush is None:
        flush = flush_l2_cache
    fn()
    flush()
    torch.cuda.synchronize()
    g_both, g_flush = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_both):
        for _ in range(reps):
            flush()
            fn()
    with torch.cuda.graph(g_flush):
        for _ in range(reps):
            flush()

    def med(g):
        ts = []
        for _ in range(replays):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) * 1e3)
        return statistics.median(ts)

    g_both.replay()
    g_flush.replay()
    torch.cuda.synchronize()
    t = (med(g_both) - med(g_flush)) / reps
    del g_both, g_flush
    return t


def compile_in_pool(worker: Callable[[str], str], jobs: Sequence[str], workers: int, what: str = "builds") -> None:
    """Run ``worker`` (a module-level function: JSON job string -> "ok" or an error text) on each job in spawned
    processes, so Triton compiles in parallel and fills its shared on-disk cache for the calling process; print
    how many ran, how long it took and each failure. ``jobs`` should already be distinct."""
    import multiprocessing as mp
    import time

    jobs = list(jobs)
    t0 = time.time()
    with mp.get_context("spawn").Pool(max(1, min(workers, len(jobs)))) as pool:
        res = pool.map(worker, jobs, chunksize=1)
    bad = [(j, r) for j, r in zip(jobs, res) if r != "ok"]
    print(f"precompiled {len(jobs)} {what} in {time.time() - t0:.1f} s; failures: {len(bad)}", flush=True)
    for j, r in bad:
        print("  compile failure", j, r, flush=True)


def geomean(values: Sequence[float]) -> float:
    """Geometric mean of positive numbers (ValueError on an empty sequence or a non-positive value)."""
    import math

    vals = list(values)
    if not vals:
        raise ValueError("geomean of an empty sequence")
    if any(v <= 0 for v in vals):
        raise ValueError(f"geomean needs positive values, got {min(vals)}")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], markdown: bool = False) -> str:
    """Print a table (rich when installed; plain text otherwise) and return it as Markdown text.

    Floats are shown with 4 significant figures. With ``markdown=True`` the Markdown text is printed instead of
    the rich table (useful to paste into docs/benchmarks.md).
    """

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
        return str(v)

    cells = [[fmt(v) for v in row] for row in rows]
    md = "\n".join(
        [f"| {' | '.join(columns)} |", "|" + "|".join(" --- " for _ in columns) + "|"]
        + [f"| {' | '.join(r)} |" for r in cells]
    )
    if markdown:
        print(f"{title}\n\n{md}")
        return md
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is a dependency, but keep the printer usable without it
        print(title)
        print(md)
        return md
    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="right")
    for r in cells:
        table.add_row(*r)
    Console(width=200).print(table)
    return md
