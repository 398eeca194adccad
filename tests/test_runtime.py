"""kernels/_runtime.py, the one host runtime of the kernel packages: its behaviour, not its positional arguments.

* ``Launch``: the first call goes through the JIT and keeps the CompiledKernel; later calls launch it directly,
  handing Triton's C launch function exactly what Triton's own path (``ck.run`` through the real
  ``wrap_handle_tensordesc``) hands it (a recording stand-in, tests/_fake_launcher.py), re-encoding a descriptor
  only when its pointer changes; Triton's path whenever FAST_LAUNCH is off, a launch hook is installed or the
  launcher has another shape.
* ``PlanCache``, ``workspace``, ``ConfigTable``, ``num_sms``: the policies every package shares.
* On a GPU: each package's host function is CUDA-graph capturable after a first call, and replays give the same
  bytes as direct calls.
"""
from __future__ import annotations

import types
import weakref

import pytest
import torch

from fp4ref.kernels import _runtime as rt

GPU = torch.cuda.is_available()


class _FakeJit:
    """Stands in for a @triton.jit function: ``kernel[grid](*args, **kw)`` records the call, returns ``ck``."""

    def __init__(self, ck):
        self.ck, self.jit_calls = ck, []

    def __getitem__(self, grid):
        def call(*args, **kw):
            self.jit_calls.append((grid, args, kw))
            return self.ck

        return call


@pytest.fixture
def compiled(monkeypatch):
    """Direct launches enabled as on a GPU (the interpreter never keeps compiled kernels)."""
    monkeypatch.setattr(rt, "_INTERPRET", False)
    monkeypatch.setattr(rt, "FAST_LAUNCH", True)


def _triton_path(monkeypatch, launch, stream, *args):
    monkeypatch.setattr(rt, "FAST_LAUNCH", False)
    launch.launch(stream, *args)
    monkeypatch.setattr(rt, "FAST_LAUNCH", True)


def test_fast_launch_is_read_on_every_launch(monkeypatch, compiled):
    """A launch made while FAST_LAUNCH is off goes through Triton's ck.run and leaves the direct launcher to be
    looked up once it is on again (it used to turn the plan's direct path off for good)."""
    from _fake_launcher import fake_compiled_kernel

    ck, calls, _ = fake_compiled_kernel(monkeypatch, {"ws": "*fp32", "M": "i32", "BLOCK": "constexpr"})
    launch = rt.Launch(_FakeJit(ck), (2,), {"BLOCK": 8})
    ws = torch.empty(4)
    launch.launch(0, ws, 3)  # the JIT
    _triton_path(monkeypatch, launch, 0, ws, 3)
    assert launch.direct is None and len(calls) == 1  # (ck.run reaches the same C function)
    launch.launch(0, ws, 3)
    assert launch.direct and len(calls) == 2 and calls[0] == calls[1]


def test_launch_direct_passes_what_triton_passes_with_descriptors(monkeypatch, compiled):
    from _fake_launcher import fake_compiled_kernel

    sig = {"a": "tensordesc<fp16[64, 64]>", "b": "tensordesc<fp16[64, 64]>", "ws": "*fp32", "M": "i32",
           "N": "i32", "BLOCK": "constexpr"}  # fmt: skip
    ck, calls, encoded = fake_compiled_kernel(monkeypatch, sig)
    jit = _FakeJit(ck)
    geometry = rt.Desc([40, 64], [64, 1], [64, 64])
    launch = rt.Launch(jit, (3, 2), {"BLOCK": 64}, descs=(geometry, geometry), num_warps=4, num_stages=3)
    A, B1, B2 = (torch.randn(40, 64).half() for _ in range(3))
    ws = torch.empty(16)

    def args(B):  # the descriptors' base tensors in their places
        return (A, B, ws, 40, 24)

    launch.launch(7, *args(B1))  # first call: the JIT, with validated descriptors and the compile options
    assert len(jit.jit_calls) == 1 and launch.ck is ck and not calls
    (grid, jargs, kw), = jit.jit_calls
    assert grid == (3, 2, 1) and kw == {"BLOCK": 64, "num_warps": 4, "num_stages": 3}
    assert [type(a).__name__ for a in jargs[:2]] == ["TensorDescriptor", "TensorDescriptor"]

    for B in (B1, B1, B2):  # direct: encode A and B1, reuse both, encode again for the new B pointer
        launch.launch(7, *args(B))
    assert launch.direct and len(encoded) == 4 and encoded[2:] == [A.data_ptr(), B2.data_ptr()]
    for B in (B1, B2):
        _triton_path(monkeypatch, launch, 7, *args(B))
    assert calls[0] == calls[1] == calls[3] and calls[2] == calls[4] and calls[0] != calls[2]
    assert calls[0][:4] == (3, 2, 1, 7)  # grid padded to 3 dimensions, then the stream
    assert len(jit.jit_calls) == 1  # never back through the JIT


@pytest.mark.parametrize("missing", ["torch", "triton"])
def test_import_without_torch_or_triton_names_the_extra(monkeypatch, missing):
    import importlib.util
    import sys

    # the package's own file executed again (installed or registered by conftest alike), as a fresh import would
    spec = sys.modules["fp4ref.kernels"].__spec__
    monkeypatch.setitem(sys.modules, missing, None)  # as if not installed (restored after the test)
    with pytest.raises(ModuleNotFoundError, match=rf"^fp4ref\.kernels needs torch and triton \({missing} is not "
                                                  r"installed\): pip install 'fp4ref\[kernels\]'$") as info:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert info.value.name == missing and isinstance(info.value.__cause__, ModuleNotFoundError)


def test_import_with_a_broken_torch_install_keeps_its_own_error(monkeypatch):
    """A module torch itself cannot find (a broken install, not the missing extra) keeps its own error."""
    import builtins
    import importlib.util
    import sys

    spec = sys.modules["fp4ref.kernels"].__spec__
    real_import = builtins.__import__

    def broken(name, *args, **kwargs):
        if name == "torch":
            raise ModuleNotFoundError("No module named 'sympy'", name="sympy")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", broken)
    with pytest.raises(ModuleNotFoundError, match=r"^No module named 'sympy'$") as info:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert info.value.name == "sympy"


def test_desc_views_its_base_as_its_dtype_and_launch_takes_only_descs():
    """A geometry with a dtype (NVFP4 codes / scale bytes as uint8) views the base it is given, on the validated
    first-launch descriptor and on the encoding one alike, without copying; the caller's tensor is not changed.
    A Launch's ``descs`` must be Desc geometries."""
    pytest.importorskip("triton.tools.tensor_descriptor")
    codes = torch.randint(-128, 128, (40, 64), dtype=torch.int8)
    before = codes.clone()
    geometry = rt.Desc([40, 64], [64, 1], [16, 64], dtype=torch.uint8)
    for validate in (True, False):
        d = geometry.tensor_descriptor(codes, validate)
        assert d.base.dtype == torch.uint8 and d.base.data_ptr() == codes.data_ptr()
        assert list(d.shape) == [40, 64] and list(d.strides) == [64, 1] and list(d.block_shape) == [16, 64]
    assert codes.dtype == torch.int8 and torch.equal(codes, before)
    own = rt.Desc([40, 64], [64, 1], [16, 64]).tensor_descriptor(codes, False)
    assert own.base is codes  # no dtype: the tensor itself
    with pytest.raises(TypeError, match="descs"):
        rt.Launch(_FakeJit(None), (1,), {}, descs=(codes,))


def test_desc_parts_split_one_block_axis_into_the_tile_parts():
    """A 192-wide tile: a box of 128 then one of 64 along the named axis, the other axis whole, each with its
    layout, over the same tensor; a power-of-two width: its one descriptor twice (the second never read)."""
    hi, lo = rt.Desc.parts((300, 512), (512, 1), (192, 64), 0, ("L_hi", "L_lo"), torch.uint8)
    assert (hi.shape, hi.strides, hi.block_shape, hi.layout, hi.dtype) == ([300, 512], [512, 1], [128, 64], "L_hi",
                                                                          torch.uint8)
    assert (lo.shape, lo.strides, lo.block_shape, lo.layout, lo.dtype) == ([300, 512], [512, 1], [64, 64], "L_lo",
                                                                          torch.uint8)
    c_hi, c_lo = rt.Desc.parts((972, 3072), (3072, 1), (128, 80), 1, ("a", "b"))
    assert (c_hi.block_shape, c_lo.block_shape, c_lo.dtype) == ([128, 64], [128, 16], None)
    one, again = rt.Desc.parts((972, 3072), (3072, 1), (128, 256), 1, ("a", "b"))
    assert one is again and one.block_shape == [128, 256] and one.layout == "a"


def test_launch_direct_without_descriptors_passes_pointers(monkeypatch, compiled):
    from _fake_launcher import fake_compiled_kernel

    sig = {"x": "*fp32", "out": "*fp32", "n": "i32", "scale": "fp32", "BLOCK": "constexpr"}
    ck, calls, _ = fake_compiled_kernel(monkeypatch, sig)
    launch = rt.Launch(_FakeJit(ck), (5,), {"BLOCK": 128}, num_warps=8)
    x, out = torch.randn(100), torch.full((100,), float("nan"))
    launch.launch(0, x, out, 100, 0.5)
    launch.launch(0, x, out, 100, 0.5)
    _triton_path(monkeypatch, launch, 0, x, out, 100, 0.5)
    assert len(calls) == 2 and calls[0] == calls[1]
    assert (x.data_ptr(), out.data_ptr(), 100, 0.5) == calls[0][13:17]  # pointers as integers, then scalars
    assert launch.ptrs == (0, 1)  # the tensor places, found by the first direct launch
    out2 = torch.full((100,), float("nan"))
    launch.launch(0, x, out2, 100, 0.5)  # another tensor in a tensor place: its own pointer
    assert calls[-1][13:17] == (x.data_ptr(), out2.data_ptr(), 100, 0.5)
    launch.launch(0, x, out2.data_ptr(), 100, 0.5)  # an integer pointer where a tensor was: passed as it is
    assert calls[-1][13:17] == (x.data_ptr(), out2.data_ptr(), 100, 0.5) and launch.direct


def test_launch_takes_tritons_path_for_hooks_and_foreign_launchers(monkeypatch, compiled):
    from _fake_launcher import fake_compiled_kernel

    ck, calls, _ = fake_compiled_kernel(monkeypatch, {"x": "*fp32", "BLOCK": "constexpr"})
    x = torch.randn(8)
    launch = rt.Launch(_FakeJit(ck), (1,), {"BLOCK": 8})
    launch.launch(0, x)
    monkeypatch.setattr(rt, "hooks_installed", lambda: True)  # a launch hook: ck.run builds its metadata
    launch.launch(0, x)
    assert launch.direct and len(calls) == 1
    monkeypatch.setattr(rt, "hooks_installed", lambda: False)
    other = rt.Launch(_FakeJit(types.SimpleNamespace(run=object())), (1,), {})
    other.ck = types.SimpleNamespace(run=types.SimpleNamespace(launch=lambda *a: None))
    assert rt.raw_launcher(other.ck, 0) is False  # a launcher of another shape: no direct launches


def test_launch_in_clusters_of_a_one_cta_kernel(monkeypatch, compiled):
    """cluster > 1 (the nvfp4 quantizer's cluster form): a kernel compiled for one CTA per program (no num_ctas)
    whose grid of CTAs is launched as clusters: Triton's launcher gets gridX / cluster and num_ctas = cluster in the
    packed metadata (it launches gridX * num_ctas CTAs), on the first (ck.run) and the direct launches alike."""
    from _fake_launcher import fake_compiled_kernel

    ck, calls, _ = fake_compiled_kernel(monkeypatch, {"x": "*fp32", "n": "i32", "BLOCK": "constexpr"})
    ck.packed_metadata = (8, 1, 4096)
    events = []

    class Jit(_FakeJit):
        def warmup(self, *args, grid, **kw):
            events.append((grid, kw))
            return self.ck

    monkeypatch.setattr(rt, "_allow_static_shared", lambda c: events.append("allow"))
    jit = Jit(ck)
    launch = rt.Launch(jit, (32,), {"BLOCK": 8}, cluster=16, num_warps=8)
    x = torch.randn(8)
    launch.launch(0, x, 8)
    launch.launch(0, x, 8)
    assert events == [((32, 1, 1), {"BLOCK": 8, "num_warps": 8}), "allow"] and jit.jit_calls == []
    assert len(calls) == 2 and calls[0] == calls[1] and launch.direct
    assert calls[0][:3] == (2, 1, 1) and calls[0][9] == (8, 16, 4096)  # 2 clusters of 16; num_ctas = 16
    _triton_path(monkeypatch, launch, 0, x, 8)
    assert len(calls) == 3 and calls[2] == calls[0]
    for bad, grid in ((0, 32), (17, 32), (3, 32), (9, 36), (12, 48)):  # not 1 .. 8 or 16, or not dividing grid[0]
        with pytest.raises(ValueError, match="cluster=.*grid"):
            rt.Launch(jit, (grid,), {}, cluster=bad)
    ck.metadata.global_scratch_size = 64  # the launcher would size scratch for gridX * 1 CTAs
    with pytest.raises(ValueError, match="scratch"):
        rt.cluster_metadata(ck, 16)
    ck.metadata.global_scratch_size = 0
    monkeypatch.setattr(rt, "_INTERPRET", True)
    with pytest.raises(ValueError, match="interpreter"):
        rt.Launch(jit, (32,), {}, cluster=16).launch(0, x, 8)
    monkeypatch.setattr(rt, "_INTERPRET", False)
    with pytest.raises(ValueError, match="num_ctas"):
        rt.Launch(jit, (32,), {}, cluster=2, num_ctas=2)
    with pytest.raises(TypeError, match="cluster"):
        rt.Launch(jit, (32,), {}, cluster=2.0)
    ck.packed_metadata = (8, 2, 0)
    with pytest.raises(ValueError, match="packed metadata"):
        rt.cluster_metadata(ck, 16)


def test_launch_of_a_cluster_kernel_compiles_opts_in_then_launches(monkeypatch, compiled):
    """num_ctas > 1 (a kernel launched in clusters, kernels/_gluon.py's cluster split-K): the first call compiles
    through the JIT's warmup (no launch), lets the function use its static exchange buffer beside its dynamic
    shared memory, then launches the kept kernel as Triton's ck.run does; later calls launch it directly, with the
    same arguments (the cluster size travels in packed_metadata)."""
    from _fake_launcher import fake_compiled_kernel

    ck, calls, _ = fake_compiled_kernel(monkeypatch, {"x": "*fp32", "n": "i32", "BLOCK": "constexpr"})
    events = []

    class Jit(_FakeJit):
        def warmup(self, *args, grid, **kw):
            events.append(("warmup", grid, args, kw))
            return self.ck

    jit = Jit(ck)
    monkeypatch.setattr(rt, "_allow_static_shared", lambda c: events.append(("allow", c)))
    launch = rt.Launch(jit, (4,), {"BLOCK": 8}, num_ctas=2)
    x = torch.randn(8)
    launch.launch(0, x, 8)
    assert [e[0] for e in events] == ["warmup", "allow"] and events[1][1] is ck and jit.jit_calls == []
    assert events[0][1] == (4, 1, 1) and events[0][3] == {"BLOCK": 8, "num_ctas": 2}
    assert len(calls) == 1 and launch.ck is ck
    launch.launch(0, x, 8)
    assert launch.direct and len(calls) == 2 and calls[0] == calls[1] and len(events) == 2


def test_allow_static_shared_sets_the_dynamic_size_and_reports_a_refusal(monkeypatch):
    """cuFuncSetAttribute(function, MAX_DYNAMIC_SHARED_SIZE_BYTES (8), the kernel's dynamic bytes) after the
    module is loaded; a driver error is a RuntimeError naming the size and the CUresult."""
    import ctypes

    seen = []

    class Driver:
        def __init__(self, rc):
            self.rc = rc

        def cuFuncSetAttribute(self, fn, attr, value):
            seen.append((fn.value, attr.value, value.value))
            return self.rc

    loaded = []
    ck = types.SimpleNamespace(function=1234, metadata=types.SimpleNamespace(shared=47160),
                               _init_handles=lambda: loaded.append(True))
    monkeypatch.setattr(ctypes, "CDLL", lambda name: Driver(0))
    rt._allow_static_shared(ck)
    assert loaded and seen == [(1234, 8, 47160)]
    monkeypatch.setattr(ctypes, "CDLL", lambda name: Driver(1))
    with pytest.raises(RuntimeError, match="47160.*CUresult 1"):
        rt._allow_static_shared(ck)


def test_launch_in_the_interpreter_always_uses_the_jit(monkeypatch):
    monkeypatch.setattr(rt, "_INTERPRET", True)
    jit = _FakeJit(types.SimpleNamespace(run=object()))
    launch = rt.Launch(jit, (1,), {})
    launch.launch(0, 1)
    launch.launch(0, 2)
    assert len(jit.jit_calls) == 2 and launch.ck is None


def test_plan_cache_is_bounded_and_cleared_together():
    a, b = rt.PlanCache("a", max_plans=2), rt.PlanCache("b")
    for k in range(3):
        a.put(k, str(k))
    b.put("x", 1)
    assert len(a) == 2 and a.get(0) is None and a.get(2) == "2"  # the oldest went first
    rt.clear_plans()
    assert len(a) == len(b) == 0


def test_current_stream_refuses_a_device_other_than_the_current_one(monkeypatch):
    """Triton launches on the current device: a kernel call on tensors of another CUDA device is refused with the
    fix named, and the current device's stream is returned for it (index given or not); the CPU has stream 0."""
    monkeypatch.setattr(rt, "_GET_DEVICE", lambda: 1)
    monkeypatch.setattr(rt, "_RAW_STREAM", lambda index: 1000 + index)
    assert rt.current_stream(torch.device("cuda", 1)) == 1001
    assert rt.current_stream(torch.device("cuda")) == 1001
    assert rt.current_stream(torch.device("cpu")) == 0
    with pytest.raises(ValueError, match=r"on cuda:0 but the current CUDA device is cuda:1.*torch.cuda.device\(0\)"):
        rt.current_stream(torch.device("cuda", 0))


def test_a_grid_beyond_cuda_limits_is_refused_when_the_plan_is_built():
    def kern():
        pass

    rt.Launch(kern, (2**31 - 1, 65535, 65535), {})
    for grid in [(2**31, 1, 1), (1, 65536), (4, 1, 70000)]:
        with pytest.raises(ValueError, match=r"kern: grid .* exceeds CUDA's limits"):
            rt.Launch(kern, grid, {})


def test_element_extent_and_the_32_bit_offset_check():
    meta = torch.empty((2**20, 2**12), device="meta", dtype=torch.float16)
    assert rt.element_extent(meta) == 2**32 and rt.element_extent(meta[:, :8]) == (2**20 - 1) * 2**12 + 8
    assert rt.element_extent(meta.t()) == 2**32 and rt.element_extent(meta[:0]) == 0
    assert rt.element_extent(torch.empty((5, 3), device="meta").expand(7, 5, 3)) == 15  # stride 0: one copy
    rt.check_int32_offsets("test path", a=2**31 - 1, b=0)
    with pytest.raises(ValueError, match=r"b extends over 2147483648 elements: the test path indexes it"):
        rt.check_int32_offsets("test path", a=1, b=2**31)


def test_clearing_workspaces_drops_the_plans_that_hold_views_of_them():
    dev = torch.device("cpu")
    cache = rt.PlanCache("t_views")
    w = rt.workspace(dev, 0, "t_views", 64, torch.float32)
    cache.put("k", (w[:8],))  # a plan keeping a view of its workspace (as the DP4A and expand launches do)
    gone = weakref.ref(w)
    del w
    rt.clear_workspaces()
    assert len(cache) == 0 and gone() is None and rt.workspace_bytes() == 0


def test_workspace_grows_per_device_stream_and_name(monkeypatch):
    dev = torch.device("cpu")
    real_empty = torch.empty
    # fresh memory may happen to be zero: make every uninitialised buffer garbage, so zeroed=True is what zeroes
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(0x5A5A))
    assert rt.workspace(dev, 0, "t_raw", 10, torch.int32).eq(0x5A5A).all()
    w1 = rt.workspace(dev, 0, "t_cnt", 10, torch.int32, zeroed=True)
    assert w1.numel() == 10 and not w1.any()
    assert rt.workspace(dev, 0, "t_cnt", 5, torch.int32) is w1  # big enough: the same buffer
    w2 = rt.workspace(dev, 0, "t_cnt", 20, torch.int32, zeroed=True)
    assert w2 is not w1 and w2.numel() == 20
    assert rt.workspace(dev, 1, "t_cnt", 5, torch.int32, zeroed=True) is not w2  # another stream
    with pytest.raises(ValueError, match="dtype"):
        rt.workspace(dev, 0, "t_cnt", 5, torch.float32)
    before = rt.workspace_bytes()
    assert before >= 4 * 25
    rt.clear_workspaces()
    assert rt.workspace_bytes() == 0


def test_split_scratch_is_the_workspaces_or_the_typed_stand_ins():
    dev = torch.device("cpu")
    before = rt.workspace_bytes()
    ws, cnt = rt.split_scratch(dev, 0, "t_part", 0, "t_locks", 7)  # no split tile: the one-element stand-ins
    assert (ws.dtype, cnt.dtype, ws.numel(), cnt.numel()) == (torch.float32, torch.int32, 1, 1)
    stand_ins = rt.unused_scratch(dev)
    assert ws is stand_ins[0] and cnt is stand_ins[1] and rt.workspace_bytes() == before  # no workspace made
    ws, cnt = rt.split_scratch(dev, 0, "t_part", 12, "t_locks", 7)
    assert (ws.dtype, ws.numel(), cnt.dtype, cnt.numel()) == (torch.float32, 12, torch.int32, 7) and not cnt.any()
    assert ws is rt.workspace(dev, 0, "t_part", 12, torch.float32)
    assert cnt is rt.workspace(dev, 0, "t_locks", 7, torch.int32)
    rt.clear_workspaces()


def test_config_table_picks_by_m():
    t = rt.ConfigTable(rows=((16, "small"), (256, "mid")), larger="large")
    assert [t.pick(m) for m in (1, 16, 17, 256, 257, 10**9)] == ["small", "small", "mid", "mid", "large", "large"]
    assert t.configs() == ["small", "mid", "large"]
    with pytest.raises(ValueError):
        rt.ConfigTable(rows=((64, "a"), (16, "b")), larger="c")


def test_num_sms_in_the_interpreter():
    assert rt.num_sms(torch.device("cpu")) == rt.INTERPRETER_SMS
    assert rt.current_stream(torch.device("cpu")) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_host_functions_are_cuda_graph_capturable():
    """A first call compiles and allocates; then a captured call replays to the same bytes as a direct call."""
    import numpy as np

    from fp4ref import packing
    from fp4ref.kernels.gemm_fp16 import gemm_fp16
    from fp4ref.kernels.nvfp4_linear import nvfp4_linear
    from fp4ref.kernels.sparse_gemm_fp4_fp8 import sparse_gemm_fp4_fp8

    g = torch.Generator(device="cuda").manual_seed(0)
    A = torch.randn(16, 2048, device="cuda", generator=g).half()
    B = torch.randn(3072, 2048, device="cuda", generator=g).half()
    vals = torch.randint(-128, 128, (64, 512), device="cuda", dtype=torch.int8, generator=g)
    meta = torch.randint(-128, 128, (64, 512), device="cuda", dtype=torch.int8, generator=g)
    b8 = torch.randn(2048, 2048, device="cuda", generator=g).to(torch.float8_e4m3fn)
    x = torch.randn(4, 8192, device="cuda", generator=g).bfloat16()  # quantizer: the read-all form
    x16 = torch.randn(16, 8192, device="cuda", generator=g).bfloat16()  # the grid barrier (a cooperative launch)
    rng = np.random.default_rng(0)
    w = torch.from_numpy(packing.pack_fp4(rng.integers(0, 16, (8192, 8192), dtype=np.uint8))).cuda()
    ws = torch.from_numpy(rng.integers(0x20, 0x40, (8192, 512), dtype=np.uint8)).cuda()
    calls = {
        "gemm_fp16": lambda: gemm_fp16(A, B),
        "sparse_gemm_fp4_fp8": lambda: sparse_gemm_fp4_fp8(vals, meta, b8),
        "nvfp4_linear": lambda: nvfp4_linear(x, w, ws, 0.01),
        "nvfp4_linear M=16": lambda: nvfp4_linear(x16, w, ws, 0.01),
    }
    for name, fn in calls.items():
        want = fn()
        want = fn()  # second call: the kept kernels, as a capture will launch them
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = fn()
        got.fill_(float("nan"))  # each replay must write every element
        for _ in range(3):  # replays reuse the workspaces (split-K counters, the quantizer's grid barrier)
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), name


def test_check_device_names_the_interpreter_for_cpu_tensors(monkeypatch):
    t = torch.zeros(4)
    monkeypatch.setattr(rt, "_INTERPRET", False)
    with pytest.raises(ValueError, match=r"x\.device=cpu.*TRITON_INTERPRET=1"):
        rt.check_device(t, "x")
    monkeypatch.setattr(rt, "_INTERPRET", True)
    rt.check_device(t, "x")  # the interpreter runs CPU tensors
    with pytest.raises(ValueError, match="meta"):
        rt.check_device(torch.empty(4, device="meta"), "x")


def test_check_no_overlap():
    base = torch.zeros(64, 64)
    a, b = base[:32], base[32:]
    rt.check_no_overlap(a, "out", x=b, y=torch.zeros(8))  # disjoint halves, other storage
    with pytest.raises(ValueError, match="out overlaps x"):
        rt.check_no_overlap(a, "out", x=base[16:48])
    with pytest.raises(ValueError, match="out overlaps x"):
        rt.check_no_overlap(base[:, :8], "out", x=base[:, 4:12])  # strided spans interleave
    rt.check_no_overlap(torch.zeros(0), "out", x=base)  # an empty output touches nothing
    # a strided out reaches beyond its numel: base[:, :8] spans elements 0 .. 4039 (not 0 .. 511), and
    # base[40:41, 4:12] (from element 2564) shares four of them
    with pytest.raises(ValueError, match="out overlaps x"):
        rt.check_no_overlap(base[:, :8], "out", x=base[40:41, 4:12])


def test_check_distinct_elements():
    """Elements share memory where a dimension longer than 1 has stride 0 or the strides interleave (3-D: offsets
    1*i + 2*j + 3*k reach 3 as (1, 1, 0) and (0, 0, 1)); a size-1 dimension's stride is never used."""
    rt.check_distinct_elements(torch.zeros(4, 6)[:, ::2], "t")
    rt.check_distinct_elements(torch.zeros(3).as_strided((1, 3), (0, 1)), "t")  # one row: its stride is unused
    rt.check_distinct_elements(torch.zeros(24).as_strided((2, 3, 4), (1, 2, 6)), "t")
    for shape, strides in (((2, 3), (0, 1)), ((2, 2, 2), (1, 2, 3)), ((3, 4), (2, 1))):
        with pytest.raises(ValueError, match=r"t: strides .* share memory"):
            rt.check_distinct_elements(torch.zeros(64).as_strided(shape, strides), "t")


def test_kernels_refuse_an_output_that_overlaps_an_input():
    import fp4ref.kernels.gemm_fp16 as g

    dev = "cpu" if rt.interpreting() else "cuda"
    A = torch.randn(64, 64, device=dev).half()
    B = torch.randn(64, 64, device=dev).half()
    with pytest.raises(ValueError, match="out overlaps A"):
        g.gemm_fp16(A, B, out=A)


@pytest.mark.skipif(not rt.interpreting(), reason="the CPU interpreter's numpy arithmetic")
def test_interpreted_kernels_raise_no_numpy_warnings():
    """IEEE inf / NaN inside an interpreted kernel (the quantizer's 1 / 0 for a block of zeros in the padding) are
    the arithmetic a GPU does silently: Launch runs interpreted kernels under np.errstate(all="ignore"), so a caller
    with RuntimeWarning as an error (a numpy divide by zero every call, before) still runs."""
    import warnings

    from fp4ref.kernels.nvfp4_linear import nvfp4_linear, nvfp4_quantize

    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=g)
    x = torch.randn(3, 256, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        wq, ws, wg = nvfp4_quantize(w)
        y = nvfp4_linear(x, wq, ws, float(wg))
    assert y.shape == (3, 64) and bool(torch.isfinite(y).all())

