"""fp4ref.kernels.nvfp4_linear: the NVFP4 quantizer and the NVFP4 linear layer, checked by fp4ref.

* Quantizer: bytes (packed E2M1 codes, E4M3FN block-scale bytes) and the global decode scale must EQUAL
  fp4ref.blockscale.nvfp4_quantize(x, recipe="sol") for every finite input (Hypothesis: ties, all-zero blocks and
  tensors, -0.0, subnormal block scales and inputs, huge amax; fp32 / bf16 / fp16 inputs).
* Linear: within fp4ref.bounds' per-element bound around fp4ref.gemm.nvfp4_linear's exact value, under the
  model the contract declares for the config that served the call (NUMERIC_CONTRACT), NaN-poisoned outputs;
  faithful output rounding in the CPU interpreter (it truncates bf16 stores), RNE on the GPU.
* Every config compiles for sm_90 on the CPU (fp4ref.kernels._sm90).
* GPU only (@pytest.mark.gpu): the workload's sizes (N = K = 8192, M = 1, 16, 64 and the 16 public M values),
  the public tolerance for the record, bitwise determinism.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import warnings

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from fp4ref import bounds, gemm, testing
from fp4ref.blockscale import nvfp4_quantize as ref_quantize
from fp4ref.kernels import _runtime
from fp4ref.kernels import nvfp4_linear as nvl
from fp4ref.kernels.gemm_fp16 import TmaConfig
from fp4ref.kernels.nvfp4_linear import gemv, prepass, quantize, tensorcore
from fp4ref.strategies import nvfp4_inputs, nvfp4_operands

from _marks import INTERPRETER_ONLY  # tests/_marks.py

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
MODEL = nvl.NUMERIC_CONTRACT.model_interpreter if INTERPRETED else nvl.NUMERIC_CONTRACT.model
ROUNDING = nvl.NUMERIC_CONTRACT.rounding_for(INTERPRETED)

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _to_torch(x: np.ndarray) -> torch.Tensor:
    """numpy float32 / ml_dtypes.bfloat16 / float16 -> torch on DEVICE, bit for bit."""
    if x.dtype == ml_dtypes.bfloat16:
        t = torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.ascontiguousarray(x))
    return t.to(DEVICE)


def _bf16_to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)


def _assert_quantize_equal(x: np.ndarray, want=None):
    """Kernel bytes == fp4ref 'sol' bytes for x (numpy, any supported dtype); ``want``: fp4ref's, if computed.
    Both forms of the quantizer: the default (one launch for a small x) and two launches (a forced tile)."""
    __tracebackhide__ = True
    want = ref_quantize(x, recipe="sol") if want is None else want
    k = x.shape[-1]
    _assert_quantize_form_equal(x, want, k, None)
    _assert_quantize_form_equal(x, want, k, nvl.pick_quantize_config(x.size // k, k))


def _assert_quantize_form_equal(x, want, k, config):
    __tracebackhide__ = True
    q, s, g = nvl.nvfp4_quantize(_to_torch(x), config=config)
    q = q.cpu().numpy()
    s = s.view(torch.uint8).cpu().numpy()
    g = np.float32(g.item())
    wc = want.codes.reshape(-1, k // 2)
    ws = want.scales.reshape(-1, k // 16)
    assert g.view(np.uint32) == np.float32(want.global_decode_scale).view(np.uint32), (
        f"global decode scale: kernel {g!r}, fp4ref {want.global_decode_scale!r}")
    bad = np.argwhere(s != ws)
    assert bad.size == 0, (f"{len(bad)} scale byte(s) differ; first at block {tuple(bad[0])}: kernel "
                           f"{s[tuple(bad[0])]:#04x}, fp4ref {ws[tuple(bad[0])]:#04x}")
    bad = np.argwhere(q != wc)
    assert bad.size == 0, (f"{len(bad)} code byte(s) differ; first at {tuple(bad[0])}: kernel "
                           f"{q[tuple(bad[0])]:#04x}, fp4ref {wc[tuple(bad[0])]:#04x}")


# ------------------------------------------------------------------------------------------------- quantizer


@st.composite
def quantizer_inputs(draw, max_rows=4, max_k=128):
    """x [rows, K] (K % 16 == 0) in float32 / bfloat16 / float16 with the quantizer's hard cases."""
    rows = draw(st.integers(1, max_rows))
    k = 16 * draw(st.integers(1, max_k // 16))
    dtype = draw(st.sampled_from(["bfloat16", "float32", "float16"]))
    kind = draw(st.sampled_from(["stress", "wide", "zeros", "tiny", "huge"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "stress":  # fp4ref's quantizer stress blocks: ties, zero blocks, subnormal scales, -0.0, amax 2688
        x = draw(nvfp4_inputs(rows, k)).astype(np.float32)
    elif kind == "wide":  # per-block exponents spread wide: many subnormal / saturated block scales
        x = rng.standard_normal((rows, k // 16, 16)) * np.exp2(rng.integers(-30, 30, size=(rows, k // 16, 1)))
        x = x.reshape(rows, k).astype(np.float32)
    elif kind == "zeros":  # all-zero tensor, with and without -0.0
        x = np.where(rng.random((rows, k)) < 0.5, -0.0, 0.0).astype(np.float32)
    elif kind == "tiny":  # subnormal and near-subnormal fp32 inputs (2688 / amax overflows: S_enc = FLT_MAX)
        x = (rng.standard_normal((rows, k)) * 2.0**-130).astype(np.float32)
    else:  # huge amax (near the fp32 max): S_enc tiny
        x = (rng.standard_normal((rows, k)) * 2.0**125).astype(np.float32)
    if dtype == "bfloat16":
        return x.astype(ml_dtypes.bfloat16)
    if dtype == "float16":
        with np.errstate(over="ignore"):  # the "wide" and "huge" values beyond fp16 become inf, then 0
            x = x.astype(np.float16)
        return np.where(np.isfinite(x), x, np.float16(0.0)).astype(np.float16)  # keep it finite
    return x


@given(quantizer_inputs())
@example(np.zeros((1, 16), np.float32))
@example(np.full((2, 32), -0.0, np.float32))
@example(np.array([[2688.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -5.0, 6.0, 0, -0.0, 1e-3, -0.1]],
                  np.float32))
@example(np.array([[3.4028234663852886e38] + [1.0] * 15], np.float32))
@example(np.array([[1.4e-45] + [0.0] * 15], np.float32))
def test_quantize_equals_fp4ref(x):
    _assert_quantize_equal(x)


def test_quantize_zero_block_scale_is_not_nan():
    """Public bug vector: an all-zero block beside a positive global amax gets scale byte 0x00, never 0x7F."""
    x = np.zeros((1, 32), np.float32)
    x[0, 16:] = np.linspace(-3, 3, 16)
    q, s, _ = nvl.nvfp4_quantize(_to_torch(x))
    assert s.view(torch.uint8)[0, 0].item() == 0x00
    assert q[0, :8].cpu().numpy().tolist() == [0] * 8
    _assert_quantize_equal(x)


def test_quantize_leaves_input_and_shapes():
    x = np.random.default_rng(1).standard_normal((2, 3, 64)).astype(np.float32)
    xt = _to_torch(x)
    before = xt.clone()
    q, s, g = nvl.nvfp4_quantize(xt)
    assert torch.equal(xt, before)
    assert q.shape == (6, 32) and q.dtype == torch.uint8
    assert s.shape == (6, 4) and s.dtype == torch.float8_e4m3fn
    assert g.shape == () and g.dtype == torch.float32


@pytest.mark.parametrize("bad, exc, word", [
    (torch.zeros(2, 24), ValueError, "K=24"),
    (torch.zeros(2, 32, dtype=torch.float64), TypeError, "dtype"),
    (torch.zeros(32, 4).t(), ValueError, "contiguous"),
    (torch.zeros(0, 16), ValueError, "row"),
    (np.zeros((2, 16), np.float32), TypeError, "torch.Tensor"),
])
def test_quantize_rejects(bad, exc, word):
    with pytest.raises(exc, match=word):
        nvl.nvfp4_quantize(bad)


def test_quantize_launch_count():
    """One launch (no amax kernel) where x padded to powers of two fits ONE_LAUNCH_MAX_ELEMENTS, two beyond it or
    with a forced tile; one launch refuses a larger x."""
    from fp4ref.kernels.nvfp4_linear import _quantize_config

    cap = quantize.ONE_LAUNCH_MAX_ELEMENTS
    assert cap == 8192
    assert quantize.one_launch_tile(1, 8192) == (1, 8192, 32) and quantize.one_launch_tile(2, 8192) is None
    assert quantize.one_launch_tile(1, 16) == (1, 256, 1)  # at least one 256-column chunk (PERMUTE_K)
    assert quantize.one_launch_tile(2, 1024) == (2, 1024, 8)  # 8 elements per thread
    assert quantize.one_launch_tile(3, 1504) == (4, 2048, 32) and quantize.one_launch_tile(9, 1024) is None
    cpu = torch.device("cpu")  # (no grid barrier off CUDA: one program, read-all, or two launches)
    for m, k, n in ((1, 8192, 1), (1, 6000, 1), (4, 2048, 1), (2, 8192, 1), (1, 8208, 1), (8, 8192, 1),
                    (9, 8192, 2), (8192, 8192, 2)):
        assert quantize.QuantizeLaunches(m, k, _quantize_config(m, k, cpu), True, False).launches == n, (m, k)
    assert quantize.QuantizeLaunches(1, 64, nvl.pick_quantize_config(1, 64), True, False).launches == 2
    with pytest.raises(ValueError, match="one launch"):
        quantize.QuantizeLaunches(2, 8192, None, True, False)
    for bad in (3, True, -1):
        with pytest.raises(ValueError, match="trigger_dependents"):
            quantize.QuantizeLaunches(1, 8192, None, True, False, trigger_dependents=bad)


@INTERPRETER_ONLY
def test_grid_sync_config():
    """The grid-barrier form's tile (hand-derived): 4096 elements at 4 warps, 1024 columns, doubled with the
    warps until the grid fits ``max_programs``; None beyond 16 warps."""
    gs = nvl.grid_sync_config
    Q = functools.partial(nvl.QuantizeConfig, AMAX="grid_sync")
    assert gs(2, 8192, 132) == Q(2, 1024, 4)  # BLOCK_R capped at M: 1 x 8 = 8 programs
    assert gs(16, 8192, 132) == Q(4, 1024, 4)  # 4 x 8 = 32
    assert gs(64, 8192, 132) == Q(4, 1024, 4)  # 16 x 8 = 128
    assert gs(65, 8192, 132) == Q(8, 1024, 8)  # 17 x 8 = 136 > 132 at 4 warps; 9 x 8 = 72 at 8
    assert gs(256, 8192, 132) == Q(16, 1024, 16)  # 16 x 8 = 128
    assert gs(257, 8192, 132) is None  # 17 x 8 = 136 > 132 even at 16 warps: two launches
    assert gs(32, 8192, 16) == Q(16, 1024, 16)  # a small GPU (or MIG slice): 2 x 8 = 16 programs
    assert gs(33, 8192, 16) is None and gs(64, 8192, 16) is None
    assert gs(8, 256, 132) == Q(8, 256, 4)  # K = 256: BLOCK_C 256, BLOCK_R capped at M's next power of two
    assert gs(3, 6000, 132) == Q(4, 1024, 4)  # BLOCK_R 4 = next_power_of_2(3); 1 x 6 programs
    for bad in ("grid", True, None):
        with pytest.raises(ValueError, match="AMAX"):
            nvl.QuantizeConfig(4, 1024, 4, AMAX=bad)
    for args, exc, word in [((4, 8, 4), ValueError, "BLOCK_C"), ((4, 1024, 64), ValueError, "num_warps"),
                            ((np.int64(4), 1024, 4), TypeError, "BLOCK_R"), ((4, 1024.0, 4), TypeError, "BLOCK_C")]:
        with pytest.raises(exc, match=word):
            nvl.QuantizeConfig(*args)
    for fn in (nvl.pick_quantize_config, nvl.read_all_config, lambda m, k: gs(m, k, 132)):
        for (m, k), exc in [((0, 16), ValueError), ((1, 15), ValueError), ((1, 0), ValueError),
                            ((1.5, 16), TypeError), ((None, 16), TypeError), ((np.int64(2), 16), TypeError)]:
            with pytest.raises(exc, match="M=|K="):
                fn(m, k)
    with pytest.raises(TypeError, match="max_programs"):
        gs(4, 64, 1.5)
    with pytest.raises(ValueError, match="max_programs"):
        gs(4, 64, 0)
    with pytest.raises(TypeError, match="config"):
        nvl.nvfp4_quantize(torch.ones(4, 64), config={"BLOCK_R": 4})


def test_read_all_config():
    """The read-all form's tile (hand-derived): 1024 columns (at most K's next power of two) x the rows of x
    (padded to a power of two) up to 8192 elements, 8 warps, while x padded to powers of two has at most 65536
    elements."""
    ra = nvl.read_all_config
    Q = functools.partial(nvl.QuantizeConfig, AMAX="read_all")
    assert nvl.configs.READ_ALL_MAX_ELEMENTS == 65536
    assert ra(2, 8192) == Q(2, 1024, 8) and ra(8, 8192) == Q(8, 1024, 8)  # 8 programs
    assert ra(5, 8192) == Q(8, 1024, 8)
    assert ra(9, 8192) is None  # 16 x 8192 = 131072 padded elements
    assert ra(3, 6000) == Q(4, 1024, 8)  # 4 x 8192 padded; 6 programs
    assert ra(100, 256) == Q(32, 256, 8)  # 128 x 256 padded: 4 programs of 32 rows
    assert ra(256, 256) == Q(32, 256, 8) and ra(257, 256) is None  # 512 x 256 padded


def test_cluster_config():
    """The cluster form's tile (hand-derived): x padded to powers of two split into 16 tiles of at most 2048
    columns, 8 warps, while a tile has 256 .. 8192 elements (1 .. 32 per thread)."""
    cc = nvl.cluster_config
    Q = functools.partial(nvl.QuantizeConfig, num_warps=8, AMAX="cluster")
    assert (nvl.configs.CLUSTER_CTAS, nvl.configs.CLUSTER_TILE_C, nvl.configs.CLUSTER_WARPS) == (16, 2048, 8)
    assert cc(2, 8192) == Q(1, 1024)  # 2 x 8192 / 16 = 1024 elements: 2 rows x 8 column tiles
    assert cc(4, 8192) == cc(3, 8192) == Q(1, 2048)  # 4 x 4 (M = 3: the fourth row of tiles is all padding)
    assert cc(8, 8192) == cc(5, 8192) == Q(2, 2048)  # 4 x 4
    assert cc(16, 8192) == cc(9, 8192) == Q(4, 2048)  # 4 x 4; 8192 elements, 32 per thread
    assert cc(17, 8192) is None  # 32 x 8192 / 16 = 16384 elements per tile: too many
    assert cc(32, 2048) == Q(2, 2048) and cc(64, 2048) == Q(4, 2048) and cc(65, 2048) is None
    assert cc(64, 256) == Q(4, 256) and cc(512, 256) == Q(32, 256)  # K = 256: one column tile, 16 row tiles
    assert cc(3, 6000) == Q(1, 2048)  # 4 x 8192 padded: 4 x 4 tiles, 3 x 3 of them hold x
    assert cc(1, 2048) is None and cc(2, 2048) == Q(1, 256)  # 128 elements per tile < 256 threads; 256
    for (m, k), exc in [((0, 16), ValueError), ((1, 15), ValueError), ((1.5, 16), TypeError),
                        ((np.int64(2), 16), TypeError)]:
        with pytest.raises(exc, match="M=|K="):
            cc(m, k)


def test_cluster_form_programs_cover_every_tile_once():
    """The cluster form's program numbering (quantize.py: pid_r = id // cdiv(K, BLOCK_C), pid_c = id % cdiv(K,
    BLOCK_C), ids 0 .. CLUSTER_CTAS - 1) over every x that cluster_config takes, K any multiple of 16: each
    [BLOCK_R, BLOCK_C] tile holding elements of x belongs to exactly one program, and the other programs' tiles lie
    wholly outside x (they load and store nothing). The interpreter cannot run the cluster exchange (inline PTX), so
    the arithmetic is checked here and the kernel on the GPU (test_quantize_cluster_form_with_padding_tiles)."""
    C = nvl.configs.CLUSTER_CTAS
    seen = 0
    for k in range(16, 20001, 48):
        for m in (1, 2, 3, 5, 8, 9, 12, 16, 17, 31, 64, 100, 255, 512, 1000, 4097):
            cfg = nvl.cluster_config(m, k)
            if cfg is None:
                continue
            seen += 1
            n_c = -(-k // cfg.BLOCK_C)
            tiles = [(pid // n_c, pid % n_c) for pid in range(C)]
            inside = [(r, c) for r, c in tiles if r * cfg.BLOCK_R < m and c * cfg.BLOCK_C < k]
            need = {(r, c) for r in range(-(-m // cfg.BLOCK_R)) for c in range(n_c)}
            assert len(inside) == len(set(inside)) and set(inside) == need, (m, k, cfg)
    assert seen > 1000


@INTERPRETER_ONLY
def test_quantize_one_launch_form_refusals(monkeypatch):
    """The grid and cluster forms need every program resident: refused under the CPU interpreter (programs run one
    after another), the grid form for a grid above max_programs, the cluster form for more tiles than its cluster;
    the read-all form refuses an x above its size. The default takes one program, then the cluster form (sm_90, off
    the interpreter), then read-all (any device), then the grid form (CUDA, off the interpreter), then two
    launches."""
    from fp4ref.kernels import nvfp4_linear as pkg

    _cluster_capable = pkg._cluster_capable
    cfg = nvl.grid_sync_config(16, 8192, 132)
    monkeypatch.setattr(quantize, "interpreting", lambda: True)
    with pytest.raises(ValueError, match="interpreter"):
        quantize.QuantizeLaunches(16, 8192, cfg, True, False)
    with pytest.raises(ValueError, match="'cluster'.*interpreter"):
        quantize.QuantizeLaunches(16, 8192, nvl.cluster_config(16, 8192), True, False)
    monkeypatch.setattr(quantize, "interpreting", lambda: False)
    ok = quantize.QuantizeLaunches(16, 8192, nvl.cluster_config(16, 8192), True, False)
    assert ok.launches == 1 and ok.quant.cluster == 16 and ok.quant.grid == (16, 1, 1)
    assert ok.quant.launch_grid == (1, 1, 1)  # one cluster: Triton's launcher multiplies x by its size
    with pytest.raises(ValueError, match="32 programs.*exceeds the cluster of CLUSTER_CTAS = 16"):
        quantize.QuantizeLaunches(16, 8192, nvl.QuantizeConfig(2, 2048, 8, AMAX="cluster"), True, False)
    assert quantize.QuantizeLaunches(16, 8192, cfg, True, False, max_programs=32).launches == 1
    with pytest.raises(ValueError, match="32 programs.*exceeds 31"):
        quantize.QuantizeLaunches(16, 8192, cfg, True, False, max_programs=31)
    with pytest.raises(ValueError, match="131072 elements.*READ_ALL_MAX_ELEMENTS"):
        quantize.QuantizeLaunches(9, 8192, nvl.QuantizeConfig(16, 1024, 8, AMAX="read_all"), True, False)
    monkeypatch.setattr(pkg, "interpreting", lambda: False)
    monkeypatch.setattr(pkg, "num_sms", lambda device: 132)
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    for sm90 in (True, False):
        monkeypatch.setattr(pkg, "_cluster_capable", lambda device, sm90=sm90: sm90 and device.type == "cuda")
        assert pkg._quantize_config(1, 8192, cuda) is None  # one program
        assert pkg._quantize_config(8, 8192, cuda) == (nvl.cluster_config(8, 8192) if sm90 else
                                                       nvl.read_all_config(8, 8192))
        assert pkg._quantize_config(8, 8192, cpu) == nvl.read_all_config(8, 8192)
        assert pkg._quantize_config(16, 8192, cuda) == (nvl.cluster_config(16, 8192) if sm90 else cfg)
        assert pkg._quantize_config(17, 8192, cuda) == nvl.grid_sync_config(17, 8192, 132)
        assert pkg._quantize_config(300, 8192, cuda) == nvl.pick_quantize_config(300, 8192)  # two launches
        assert pkg._quantize_config(16, 8192, cpu) == nvl.pick_quantize_config(16, 8192)
    # an explicit cluster config on a device that is not sm_90 (the stub above says so for every device)
    with pytest.raises(ValueError, match="compute capability 9.0"):
        nvl.nvfp4_quantize(torch.ones(16, 8192), config=nvl.cluster_config(16, 8192))
    monkeypatch.setattr(pkg, "_cluster_capable", _cluster_capable)
    assert not pkg._cluster_capable(cpu)  # the real check: not CUDA
    monkeypatch.setattr(pkg, "QUANTIZE_FORMS", ())
    assert pkg._quantize_config(8, 8192, cuda) == nvl.pick_quantize_config(8, 8192)
    assert pkg._quantize_config(16, 8192, cuda) == nvl.pick_quantize_config(16, 8192)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRETED, reason="needs a CUDA GPU (cooperative launch)")
def test_quantize_one_launch_forms_on_gpu():
    """The read-all, cluster and grid-barrier forms on the GPU: fp4ref's bytes with the largest |x| in the first,
    a middle or the last program's tile, calls of different forms and grid sizes interleaved (the barrier's words
    are shared), and each grid-barrier launch leaves the arrival count at 0 and advances the generation by one."""
    from fp4ref.kernels.nvfp4_linear import _AMAX_PARTS, _AMAX_WORDS

    dev = torch.device("cuda", torch.cuda.current_device())  # with its index: the workspace's key
    rng = np.random.default_rng(7)
    cases = []
    for m in (2, 5, 8, 16, 64, 100, 256):
        forms = [nvl.grid_sync_config(m, 8192, _runtime.num_sms(dev)), nvl.read_all_config(m, 8192),
                 nvl.cluster_config(m, 8192) if torch.cuda.get_device_capability(dev)[0] >= 9 else None]
        assert forms[0] is not None and forms[0].AMAX == "grid_sync" and (forms[1] is not None) == (m <= 8)
        assert forms[2] is None or m <= 16
        for cfg in filter(None, forms):
            for where in ((0, 0), (m // 2, 4100), (m - 1, 8191)):
                x = rng.standard_normal((m, 8192)).astype(np.float32).astype(ml_dtypes.bfloat16)
                x[where] = -600.0
                cases.append((x, ref_quantize(x, recipe="sol"), cfg))
    words = _runtime.workspace(dev, _runtime.current_stream(dev), _AMAX_PARTS, _AMAX_WORDS, torch.int32,
                               zeroed=True)
    gen0 = int(words[quantize.AMAX_MAX_PROGRAMS + 1])
    for x, want, cfg in cases:
        _assert_quantize_form_equal(x, want, 8192, cfg)
    torch.cuda.synchronize()
    assert int(words[quantize.AMAX_MAX_PROGRAMS]) == 0
    assert int(words[quantize.AMAX_MAX_PROGRAMS + 1]) - gen0 == sum(c.AMAX == "grid_sync" for _, _, c in cases)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRETED, reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape", [(3, 6000), (12, 8192), (5, 2064), (64, 256), (40, 1040)])
def test_quantize_cluster_form_with_padding_tiles(shape):
    """The cluster form where some of the 16 programs' tiles lie wholly past x's last row or column (K not a
    power of two, M not a multiple of the tile's rows): those programs still take part in the exchange, and the
    bytes are fp4ref's wherever the largest |x| is."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the cluster form needs sm_90")
    m, k = shape
    cfg = nvl.cluster_config(m, k)
    assert cfg is not None and cfg.AMAX == "cluster"
    rng = np.random.default_rng(m * k)
    for where in ((0, 0), (m - 1, k - 1), (m // 2, k // 2)):
        x = rng.standard_normal((m, k)).astype(np.float32).astype(ml_dtypes.bfloat16)
        x[where] = 900.0
        _assert_quantize_form_equal(x, ref_quantize(x, recipe="sol"), k, cfg)


@pytest.mark.parametrize("where", [(0, 0), (4, 2047), (2, 1024), (3, 1023)])
def test_quantize_read_all_amax_spans_all_of_x(where):
    """The read-all form (5 x 2048: too large for one program, two programs of 8 x 1024 with padding rows masked):
    each program's global amax is max |x| over all of x, wherever the largest |x| (negative) is."""
    x = np.full((5, 2048), 0.5, np.float32)
    x[where] = -1000.0
    assert quantize.one_launch_tile(5, 2048) is None
    assert nvl.read_all_config(5, 2048) == nvl.QuantizeConfig(8, 1024, 8, AMAX="read_all")
    _assert_quantize_form_equal(x, ref_quantize(x, recipe="sol"), 2048, nvl.read_all_config(5, 2048))


@pytest.mark.parametrize("where", [(0, 0), (2, 1503), (1, 700), (2, 1023)])
def test_quantize_one_launch_amax_spans_all_of_x(where):
    """The one-launch form's global amax is max |x| over all of x (3 x 1504, tile 4 x 2048 with padding rows and
    columns masked): a largest |x| (negative) anywhere sets every block's scale."""
    x = np.full((3, 1504), 0.5, np.float32)
    x[where] = -1000.0
    assert quantize.one_launch_tile(3, 1504) == (4, 2048, 32)
    _assert_quantize_equal(x)


# ---------------------------------------------------------------------------------------------------- linear


def _check_linear(x_np: np.ndarray, codes: np.ndarray, scales: np.ndarray, gw: np.float32, config=None):
    """Run the kernel into a NaN-filled output and check it against fp4ref's exact reference and bound."""
    __tracebackhide__ = True
    n = codes.shape[0]
    xt = _to_torch(x_np)
    out = torch.full((*x_np.shape[:-1], n), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    y = nvl.nvfp4_linear(xt, torch.from_numpy(codes).to(DEVICE),
                         torch.from_numpy(scales).view(torch.float8_e4m3fn).to(DEVICE), float(gw),
                         config=config, out=out)
    assert y.data_ptr() == out.data_ptr()
    ref = gemm.nvfp4_linear(x_np, codes, scales, float(gw), recipe="sol")
    cfg = nvl.pick_config(y.numel() // n, n, x_np.shape[-1]) if config is None else config
    model = nvl.accumulation_model(cfg, x_np.shape[-1], interpreter=INTERPRETED)  # the config's declared model
    report = bounds.check(_bf16_to_numpy(y), ref, model, output_rounding=ROUNDING, poison=float("nan"))
    assert report.ok, report.message()
    return report


_SMALL_CONFIGS = [
    None,  # pick_config(M, N, K)
    nvl.TensorCoreConfig(BLOCK_N=64, BLOCK_M=16, BLOCK_K=64, SPLIT_K=3, num_warps=4, num_stages=2),
    nvl.TensorCoreConfig(BLOCK_N=64, BLOCK_M=32, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=2),
    # block scales as int32 words (used when K % 64 == 0; K = 16, 48 fall back to bytes)
    nvl.TensorCoreConfig(BLOCK_N=64, BLOCK_M=16, BLOCK_K=64, SPLIT_K=2, num_warps=4, num_stages=2, SCALE_WORDS=True),
    # decode by bit placement (fp16 E2M1 * 2^-14 times scale * 2^6, accumulator times 2^8), unsplit and split-K
    nvl.TensorCoreConfig(BLOCK_N=64, BLOCK_M=16, BLOCK_K=64, SPLIT_K=1, num_warps=4, num_stages=2, DECODE_BITS=True),
    nvl.TensorCoreConfig(BLOCK_N=64, BLOCK_M=32, BLOCK_K=128, SPLIT_K=3, num_warps=4, num_stages=2, DECODE_BITS=True),
    # the large-M path: W pre-decoded to fp16, x dequantized to fp16, the TMA GEMM with the fp32 epilogue scale
    nvl.PrepassConfig(gemm=TmaConfig(64, 32, 32, num_warps=4, num_stages=2)),
    nvl.PrepassConfig(gemm=TmaConfig(64, 64, 64, SPLIT_K=2, num_warps=4, num_stages=2)),
    # the CUDA-core GEMV (block dot products exact, fp32 sum of block terms): 1 and 4 rows per program, split-K
    nvl.GemvConfig(BLOCK_N=16, BLOCK_M=1, BLOCK_K=64, SPLIT_K=1, num_warps=4, num_stages=1),
    nvl.GemvConfig(BLOCK_N=32, BLOCK_M=4, BLOCK_K=32, SPLIT_K=3, num_warps=4, num_stages=1),
]
_GEMV_CONFIGS = [c for c in _SMALL_CONFIGS if isinstance(c, nvl.GemvConfig)] + [
    nvl.GemvConfig(BLOCK_N=32, BLOCK_M=2, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=1)]


@given(data=st.data())
def test_linear_within_bound(data):
    m = data.draw(st.integers(1, 40), label="M")
    n = 16 * data.draw(st.integers(1, 6), label="N/16")
    k = 16 * data.draw(st.sampled_from([1, 3, 4, 8, 12]), label="K/16")  # K = 48, 192: BLOCK_K falls to 16 / 64
    config = data.draw(st.sampled_from(_SMALL_CONFIGS), label="config")
    x = data.draw(nvfp4_inputs(m, k), label="x")
    w = data.draw(nvfp4_operands(n, k), label="w")
    _check_linear(x.reshape(1, m, k), w["codes"], w["scales"], w["global_decode_scale"], config)


def test_linear_quantized_weights_and_leading_dims():
    """Weights from fp4ref's own 'sol' quantizer (the workload's), x [2, 3, K]: shape [2, 3, N]."""
    rng = np.random.default_rng(7)
    wq = ref_quantize(rng.standard_normal((96, 256), dtype=np.float32), recipe="sol")
    x = rng.standard_normal((2, 3, 256)).astype(np.float32).astype(ml_dtypes.bfloat16)
    _check_linear(x, wq.codes, wq.scales, wq.global_decode_scale)


def test_linear_weight_dtype_float4_x2_and_sign_ignored_scales():
    """torch.float4_e2m1fn_x2 weights give the same bytes as uint8; scale sign bits are ignored (UE4M3)."""
    rng = np.random.default_rng(3)
    wq = ref_quantize(rng.standard_normal((32, 64), dtype=np.float32), recipe="sol")
    x = _to_torch(rng.standard_normal((1, 5, 64)).astype(np.float32).astype(ml_dtypes.bfloat16))
    codes = torch.from_numpy(wq.codes).to(DEVICE)
    scales = torch.from_numpy(wq.scales).to(DEVICE)
    y0 = nvl.nvfp4_linear(x, codes, scales.view(torch.float8_e4m3fn), float(wq.global_decode_scale))
    y1 = nvl.nvfp4_linear(x, codes.view(torch.float4_e2m1fn_x2), (scales | 0x80).view(torch.float8_e4m3fn),
                          float(wq.global_decode_scale))
    assert torch.equal(y0.view(torch.int16), y1.view(torch.int16))


def test_chunk_rows():
    assert nvl.X_WORKSPACE_MAX_BYTES == 16 * 2**20
    assert nvl.chunk_rows(1024, 8192, 2) == 1024  # 16 MiB exactly: one piece
    assert nvl.chunk_rows(1025, 8192, 2) == nvl.chunk_rows(16384, 8192, 2) == 1024
    assert nvl.chunk_rows(16384, 8192, 4) == 512 and nvl.chunk_rows(4096, 6000, 2) == 1280
    assert nvl.chunk_rows(7, 64, 2, cap=3 * 64 * 2) == 3 and nvl.chunk_rows(7, 64, 2, cap=10) == 1
    assert nvl.chunk_rows(300, 16, 2, cap=300 * 16 * 2) == 300  # all of x fits exactly: one piece
    assert nvl.chunk_rows(301, 16, 2, cap=300 * 16 * 2) == 256


@pytest.mark.parametrize("config", [_SMALL_CONFIGS[1], _SMALL_CONFIGS[4], _GEMV_CONFIGS[1]], ids=repr)
def test_linear_row_chunks_give_the_same_bits(config, monkeypatch):
    """Where x dequantized would exceed X_WORKSPACE_MAX_BYTES the call goes in row chunks after one amax over all
    of x: bitwise the output of the unchunked call (the largest |x| in the last chunk, the last chunk shorter),
    with a dequantized-x workspace of one chunk."""
    rng = np.random.default_rng(21)
    M, N, K = 7, 48, 64
    wq = ref_quantize(rng.standard_normal((N, K), dtype=np.float32), recipe="sol")
    x_np = rng.standard_normal((M, K)).astype(np.float32)
    x_np[6, 5] = -40.0  # the global amax, in the last (one-row) chunk
    x = _to_torch(x_np.astype(ml_dtypes.bfloat16))
    codes, scales = torch.from_numpy(wq.codes).to(DEVICE), torch.from_numpy(wq.scales).to(DEVICE)
    gd = float(wq.global_decode_scale)
    whole = nvl.nvfp4_linear(x, codes, scales, gd, config=config)
    itemsize = 4 if isinstance(config, nvl.GemvConfig) else 2
    monkeypatch.setattr(nvl, "X_WORKSPACE_MAX_BYTES", 3 * K * itemsize)  # chunks of 3, 3 and 1 rows
    _runtime.clear_plans()
    _runtime.clear_workspaces()
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    chunked = nvl.nvfp4_linear(x, codes, scales, gd, config=config, out=out)
    deq = _runtime.workspace(x.device, _runtime.current_stream(x.device),
                             nvl._DEQUANT[torch.float32 if itemsize == 4 else torch.float16], 1,
                             torch.float32 if itemsize == 4 else torch.float16)
    assert deq.numel() == 3 * K  # one chunk's rows
    assert torch.equal(chunked.view(torch.int16), whole.view(torch.int16))
    _runtime.clear_plans()  # plans made under the patched cap
    _check_linear(x_np.astype(ml_dtypes.bfloat16), wq.codes, wq.scales, wq.global_decode_scale, config)


def test_linear_scale_words_equal_scale_bytes():
    """Block scales loaded as int32 words (SCALE_WORDS) give bitwise the same output as byte loads."""
    rng = np.random.default_rng(5)
    wq = ref_quantize(rng.standard_normal((48, 192), dtype=np.float32) * np.exp2(rng.integers(-20, 20, (48, 1))),
                      recipe="sol")
    x = _to_torch(rng.standard_normal((1, 7, 192)).astype(np.float32).astype(ml_dtypes.bfloat16))
    args = (x, torch.from_numpy(wq.codes).to(DEVICE), torch.from_numpy(wq.scales).to(DEVICE),
            float(wq.global_decode_scale))
    outs = [nvl.nvfp4_linear(*args, config=nvl.TensorCoreConfig(64, 16, 64, 3, 4, 2, SCALE_WORDS=words))
            for words in (False, True)]
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))


@pytest.mark.parametrize("split_k", [1, 2])
def test_linear_decode_bits_equals_cvt_decode(split_k):
    """DECODE_BITS (fp16 subnormal-range weights times 2^-8, accumulator times 2^8) gives bitwise the output of
    the cvt decode, over every code and the extreme scale bytes (0x01 = 2^-9: fp16 subnormal decoded weights;
    0x7E = 448), and matches fp4ref's bound."""
    rng = np.random.default_rng(23)
    n, k = 64, 128
    codes = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    scales = rng.choice(np.array([0x01, 0x02, 0x07, 0x08, 0x30, 0x55, 0x7E, 0x00], np.uint8), size=(n, k // 16))
    x_np = (rng.standard_normal((1, 9, k)) * np.exp2(rng.integers(-8, 8, (1, 9, 1)))).astype(np.float32)
    x_np = x_np.astype(ml_dtypes.bfloat16)
    outs = [_check_linear(x_np, codes, scales, np.float32(0.75),
                          nvl.TensorCoreConfig(64, 16, 64, split_k, 4, 2, DECODE_BITS=bits)) for bits in (False, True)]
    del outs
    args = (_to_torch(x_np), torch.from_numpy(codes).to(DEVICE), torch.from_numpy(scales).to(DEVICE), 0.75)
    y = [nvl.nvfp4_linear(*args, config=nvl.TensorCoreConfig(64, 16, 64, split_k, 4, 2, DECODE_BITS=bits))
         for bits in (False, True)]
    assert torch.equal(y[0].view(torch.int16), y[1].view(torch.int16))


def test_linear_prepass_into_unaligned_out():
    """The pre-pass path writes a caller's ``out`` whose data pointer is not 16-byte aligned (TMA cannot store
    there directly): same bytes as an aligned output."""
    rng = np.random.default_rng(29)
    wq = ref_quantize(rng.standard_normal((32, 64), dtype=np.float32), recipe="sol")
    x = _to_torch(rng.standard_normal((1, 3, 64)).astype(np.float32).astype(ml_dtypes.bfloat16))
    cfg = nvl.PrepassConfig(gemm=TmaConfig(64, 32, 32, num_warps=4, num_stages=2))
    args = (x, torch.from_numpy(wq.codes).to(DEVICE), torch.from_numpy(wq.scales).to(DEVICE),
            float(wq.global_decode_scale))
    y = nvl.nvfp4_linear(*args, config=cfg)
    buf = torch.full((3 * 32 + 1,), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    out = buf[1:].view(1, 3, 32)  # 2-byte offset
    assert out.data_ptr() % 16
    nvl.nvfp4_linear(*args, config=cfg, out=out)
    assert torch.equal(out.view(torch.int16), y.view(torch.int16))


def test_linear_rejects():
    x = torch.zeros(1, 4, 64, dtype=torch.bfloat16, device=DEVICE)
    w = torch.zeros(32, 32, dtype=torch.uint8, device=DEVICE)
    s = torch.zeros(32, 4, dtype=torch.uint8, device=DEVICE)
    with pytest.raises(ValueError, match="weight_fp4.shape"):
        nvl.nvfp4_linear(x, torch.zeros(32, 16, dtype=torch.uint8, device=DEVICE), s, 1.0)
    with pytest.raises(ValueError, match="weight_scales.shape"):
        nvl.nvfp4_linear(x, w, torch.zeros(32, 2, dtype=torch.uint8, device=DEVICE), 1.0)
    with pytest.raises(ValueError, match="N=24"):
        nvl.nvfp4_linear(x, torch.zeros(24, 32, dtype=torch.uint8, device=DEVICE),
                         torch.zeros(24, 4, dtype=torch.uint8, device=DEVICE), 1.0)
    with pytest.raises(TypeError, match="weight_fp4.dtype"):
        nvl.nvfp4_linear(x, w.to(torch.int16), s, 1.0)
    with pytest.raises(TypeError, match=r"weight_global_decode_scale.*float\(t\) once"):  # no hidden sync
        nvl.nvfp4_linear(x, w, s, torch.tensor(1.0))
    with pytest.raises(ValueError, match="out"):
        nvl.nvfp4_linear(x, w, s, 1.0, out=torch.empty(4, 32, dtype=torch.bfloat16, device=DEVICE))
    for bad_scale in (-1.0, 0.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="weight_global_decode_scale"):
            nvl.nvfp4_linear(x, w, s, bad_scale)
    w_off = torch.zeros(32 * 32 + 1, dtype=torch.uint8, device=DEVICE)[1:].view(32, 32)  # base 1 byte off
    with pytest.raises(ValueError, match="weight_fp4.data_ptr"):
        nvl.nvfp4_linear(x, w_off, s, 1.0)
    with pytest.raises(ValueError, match="weight_scales is not contiguous"):
        nvl.nvfp4_linear(x, w, torch.zeros(4, 32, dtype=torch.uint8, device=DEVICE).t(), 1.0)
    # a wrong shape is named before the layout: a transposed [K/2, N] weight is a shape error, not a stride one
    with pytest.raises(ValueError, match="weight_fp4.shape"):
        nvl.nvfp4_linear(x, torch.zeros(16, 32, dtype=torch.uint8, device=DEVICE).t(), s, 1.0)


def test_linear_validates_new_keys_after_a_cached_call():
    """After a call has cached the launch plan of its shapes, the same shapes give the same bytes again (a fresh
    output each call) and calls that differ (weight_global_decode_scale, weight shape, config, out) are
    validated as on a first call."""
    rng = np.random.default_rng(31)
    wq = ref_quantize(rng.standard_normal((32, 64), dtype=np.float32), recipe="sol")
    x = _to_torch(rng.standard_normal((1, 2, 64)).astype(np.float32).astype(ml_dtypes.bfloat16))
    w = torch.from_numpy(wq.codes).to(DEVICE)
    ws = torch.from_numpy(wq.scales).view(torch.float8_e4m3fn).to(DEVICE)
    gw = float(wq.global_decode_scale)
    y1, y2 = nvl.nvfp4_linear(x, w, ws, gw), nvl.nvfp4_linear(x, w, ws, gw)
    assert y1.data_ptr() != y2.data_ptr() and torch.equal(y1.view(torch.int16), y2.view(torch.int16))
    # (after a validated call of this key, so the per-call check is the one tested) fp32 rounding of 1e300
    # overflows and of 1e-50 underflows: the kernels would write inf or 0
    for bad in (-0.5, 0.0, float("nan"), float("inf"), 1e300, 1e-50, 2.0**-150, 2.0**128 - 2.0**103):
        with pytest.raises(ValueError, match="weight_global_decode_scale"):
            nvl.nvfp4_linear(x, w, ws, bad)
    with pytest.raises(TypeError, match="weight_global_decode_scale"):
        nvl.nvfp4_linear(x, w, ws, "0.01")
    # the fp32 value fp4ref's NVFP4Tensor holds, and the extremes that round to finite nonzero fp32 values
    # the range checks (first call, then the cached plan's) cast no bound to float32: 2^128 - 2^103 overflows it
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "overflow encountered in cast", RuntimeWarning)
        for _ in range(2):
            assert torch.equal(nvl.nvfp4_linear(x, w, ws, np.float32(gw)).view(torch.int16), y1.view(torch.int16))
    for bad in (np.float32(0.0), np.float32("inf"), np.float16("nan")):
        with pytest.raises(ValueError, match="weight_global_decode_scale"):
            nvl.nvfp4_linear(x, w, ws, bad)
    for ok in (2.0**-149, 3.4028234663852886e38):
        assert nvl.nvfp4_linear(x, w, ws, ok).shape == y1.shape
    with pytest.raises(ValueError, match="weight_fp4.shape"):
        nvl.nvfp4_linear(x, w[:, :16].clone(), ws, gw)
    with pytest.raises(TypeError, match="config"):
        nvl.nvfp4_linear(x, w, ws, gw, config="gemv")
    with pytest.raises(ValueError, match="out"):
        nvl.nvfp4_linear(x, w, ws, gw, out=torch.empty(1, 2, 31, dtype=torch.bfloat16, device=DEVICE))


def _small_linear(seed: int = 31):
    """x [1, 2, 64] bf16 and a [32, 64] weight quantized by recipe sol (codes, E4M3FN scales, global decode)."""
    rng = np.random.default_rng(seed)
    wq = ref_quantize(rng.standard_normal((32, 64), dtype=np.float32), recipe="sol")
    x = _to_torch(rng.standard_normal((1, 2, 64)).astype(np.float32).astype(ml_dtypes.bfloat16))
    return (x, torch.from_numpy(wq.codes).to(DEVICE), torch.from_numpy(wq.scales).view(torch.float8_e4m3fn).to(DEVICE),
            float(wq.global_decode_scale))


def test_linear_refuses_no_rows_of_w_and_scales_of_another_dtype():
    x, w, s, gw = _small_linear()
    with pytest.raises(ValueError, match="N=0"):
        nvl.nvfp4_linear(x, w[:0], s[:0], gw)
    with pytest.raises(TypeError, match=r"weight_scales.dtype=torch.int16"):
        nvl.nvfp4_linear(x, w, s.view(torch.uint8).to(torch.int16), gw)


def test_linear_out_must_be_contiguous_and_apart_from_every_input():
    """A transposed out is refused on a first call and after the plan of a contiguous out is cached (the key holds
    out's contiguity), and left as it was; an out sharing memory with the block scales is refused."""
    x, w, s, gw = _small_linear()
    want = nvl.nvfp4_linear(x, w, s, gw)
    bad = torch.full((1, 32, 2), float("nan"), dtype=torch.bfloat16, device=DEVICE).transpose(1, 2)
    for _ in range(2):
        with pytest.raises(ValueError, match="contiguous"):
            nvl.nvfp4_linear(x, w, s, gw, out=bad)
        assert torch.isnan(bad).all()
        out = torch.full((1, 2, 32), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        assert torch.equal(nvl.nvfp4_linear(x, w, s, gw, out=out).view(torch.int16), want.view(torch.int16))
    out = torch.full((1, 2, 32), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    inside = out.view(torch.uint8).view(32, 4)  # out's 128 bytes hold a copy of the [32, 4] scale bytes
    inside.copy_(s.view(torch.uint8))
    with pytest.raises(ValueError, match="out overlaps weight_scales"):
        nvl.nvfp4_linear(x, w, inside.view(torch.float8_e4m3fn), gw, out=out)


def _e2m1_e4m3_values(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Exact float64 decode of packed E2M1 codes [N, K/2] and E4M3FN block-scale bytes [N, K/16] (sign ignored),
    by tables (independent of the kernels' bit tricks)."""
    e2m1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
    n = codes.shape[0]
    c = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(n, -1)
    s = (scales.view(np.uint8) & 0x7F).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return e2m1[c] * np.repeat(s, 16, axis=1)


@pytest.mark.parametrize("dtype,tile,k", [(torch.bfloat16, None, 80), (torch.float16, None, 80),
                                          (torch.float16, (16, 512, 4, "cvt"), 80),
                                          (torch.float16, (8, 128, 4, "cvt"), 256)])
def test_decode_weight_prepass_is_exact(dtype, tile, k):
    """The large-M pre-pass (both modes) writes E2M1 value * block scale exactly, for every code and every scale
    byte (zero, subnormal, 448, sign bit set), at shapes with row and column tails (N = 20, K = 80: partial
    tiles; the "cvt" mode narrows BLOCK_C to a divisor of K and clamps rows)."""
    rng = np.random.default_rng(17)
    n = 20
    codes = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    codes[0, :8] = np.arange(0, 256, 17, dtype=np.uint8)[:8]  # all 16 nibbles appear
    scales = rng.integers(0, 256, size=(n, k // 16), dtype=np.uint8)
    scales[scales & 0x7F == 0x7F] = 0x7E  # NaN bytes are not valid block scales
    scales[1, :5] = [0x00, 0x01, 0x07, 0x08, 0x7E]  # zero, subnormals 2^-9 and 7 * 2^-9, 2^-6, 448
    out = torch.full((n, k), float("nan"), dtype=dtype, device=DEVICE)
    tile_kw = {} if tile is None else dict(zip(("BLOCK_R", "BLOCK_C", "num_warps", "mode"), tile))
    prepass.decode_weight(torch.from_numpy(codes).to(DEVICE), torch.from_numpy(scales).to(DEVICE), out, **tile_kw)
    want = _e2m1_e4m3_values(codes, scales)
    got = out.float().cpu().numpy().astype(np.float64)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("config", _GEMV_CONFIGS, ids=lambda c: f"gemv{c.BLOCK_N}x{c.BLOCK_M}x{c.BLOCK_K}s{c.SPLIT_K}")
def test_gemv_within_bound_and_deterministic(m, config):
    """GEMV configs at M = 1..4 (rows past M in a program, ragged N tiles: N = 48), quantized random weights with
    one row of subnormal and one of max block scales; within the config's own (tighter) model; two calls bitwise
    equal."""
    rng = np.random.default_rng(100 + m)
    n, k = 48, 256
    w = rng.standard_normal((n, k)).astype(np.float32)
    w[1] *= 1e-6  # block scales of row 1: E4M3 subnormals relative to the global amax
    w[2, :16] = 6.0  # one block that pins the global amax: scale 448
    wq = ref_quantize(w, recipe="sol")
    x = (rng.standard_normal((1, m, k)) * 3).astype(np.float32).astype(ml_dtypes.bfloat16)
    y = _check_linear(x, wq.codes, wq.scales, wq.global_decode_scale, config)
    assert "fp32_rn_block16" in nvl.accumulation_model(config, k)
    args = (_to_torch(x), torch.from_numpy(wq.codes).to(DEVICE),
            torch.from_numpy(wq.scales).view(torch.float8_e4m3fn).to(DEVICE), float(wq.global_decode_scale))
    y1 = nvl.nvfp4_linear(*args, config=config)
    y2 = nvl.nvfp4_linear(*args, config=config)
    assert torch.equal(y1.view(torch.int16), y2.view(torch.int16))
    assert y.bitwise_equal_fraction > 0  # not vacuous: some outputs are the correctly rounded value


_E2M1 = [0, 1, 2, 3, 4, 6, 8, 12]  # E2M1 magnitudes in units of 1/2


def _fraction_of_e4m3(b: int):
    from fractions import Fraction

    e, mnt = (b >> 3) & 0xF, b & 7
    return Fraction(mnt, 512) if e == 0 else Fraction(8 + mnt, 8) * Fraction(2) ** (e - 7) / 1


def _fraction_of_code(c: int):
    from fractions import Fraction

    v = Fraction(_E2M1[c & 7], 2)
    return -v if c & 8 else v


@pytest.mark.parametrize("config", _GEMV_CONFIGS[:2], ids=["gemv_m1", "gemv_m4_split"])
def test_gemv_block_partial_is_exact(config):
    """K = 16 (one NVFP4 block per output): the kernel's only arithmetic before the epilogue is the block dot
    product, claimed EXACT in fp32 (module comment above nvfp4_gemv_kernel). Adversarial operands: max codes
    (+-6), block scales 448, 2^-9 (smallest subnormal), 2^-6 and 7 * 2^-9, x blocks at the global amax (x scale
    448) and tiny ones (x scale an E4M3 subnormal). Expected value computed independently with Fractions from the
    codes and scale bytes; it must be an fp32, and y must be the RNE (interpreter: faithful) bf16 of
    fp32(fp32(C) * fp32(x_gdec * w_gdec))."""
    from fractions import Fraction

    k = 16
    x = np.zeros((4, k), np.float32)
    x[0] = 6.0 * np.where(np.arange(k) % 3 == 0, -1, 1)  # the global amax block: codes +-6, scale 448
    x[1] = 6.0 * 2.0**-16 * np.where(np.arange(k) % 2, -1, 1)  # tiny: scale an E4M3 subnormal
    x[2] = np.linspace(-6.0, 6.0, k)  # every code class
    x[3] = 5.9 * 2.0**-14  # tiny, all equal
    codes = np.zeros((6, k // 2), np.uint8)
    codes[0] = 0x77  # all +6
    codes[1] = 0xFF  # all -6
    codes[2] = 0xF7  # +6, -6 alternating
    codes[3] = np.arange(8, dtype=np.uint8) * 0x11 ^ 0x80  # mixed codes and signs
    codes[4] = 0x71
    codes[5] = 0x9E
    scales = np.array([[0x7E], [0x01], [0x08], [0x07], [0x7E], [0x01]], np.uint8)
    n = 16  # rows 6..15 repeat 0..5 (a full N tile)
    codes = np.tile(codes, (3, 1))[:n]
    scales = np.tile(scales, (3, 1))[:n]
    gw = np.float32(0.75)
    m = x.shape[0] if config.BLOCK_M > 1 else 1
    x = x[:m]
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    y = nvl.nvfp4_linear(_to_torch(x), torch.from_numpy(codes).to(DEVICE),
                         torch.from_numpy(scales).view(torch.float8_e4m3fn).to(DEVICE), float(gw),
                         config=config, out=out)
    got = _bf16_to_numpy(y).astype(np.float64)
    xq = ref_quantize(x, recipe="sol")
    xc = xq.codes.reshape(m, k // 2)
    g = np.float32(np.float32(xq.global_decode_scale) * gw)
    assert int(xq.scales.reshape(m)[0]) == 0x7E
    if m > 1:
        assert int(xq.scales.reshape(m)[1]) < 8  # an E4M3 subnormal x block scale
    for i in range(m):
        sx = _fraction_of_e4m3(int(xq.scales.reshape(m)[i]))
        for j in range(n):
            sw = _fraction_of_e4m3(int(scales[j, 0]))
            c = Fraction(0)
            for t in range(k):
                cx = (int(xc[i, t // 2]) >> (4 * (t % 2))) & 0xF
                cw = (int(codes[j, t // 2]) >> (4 * (t % 2))) & 0xF
                c += _fraction_of_code(cx) * sx * _fraction_of_code(cw) * sw
            c32 = np.float32(float(c))
            assert Fraction(float(c32)) == c, "the block dot product is not an fp32"
            want = np.float32(c32 * g)  # the epilogue's one fp32 multiply
            if INTERPRETED:  # faithful (the interpreter truncates bf16 stores): within one bf16 ulp of want
                ulp = 2.0 ** (np.floor(np.log2(abs(float(want)))) - 7) if want != 0 else 0.0
                assert abs(got[i, j] - float(want)) < ulp or got[i, j] == float(want), (i, j, got[i, j], want)
            else:
                assert got[i, j] == np.float64(want.astype(ml_dtypes.bfloat16)), (i, j, got[i, j], want)
    assert np.abs(got).max() > 0


def test_gemv_model_is_registered_and_tighter():
    """fp32_rn_block16 is gamma_{K/16}(2^-24); the GEMV split-K model at the workload size is tighter than the
    tensor-core path's declared one (no bound was weakened)."""
    m = bounds.get_model("fp32_rn_block16")
    assert m.eps(8192) == pytest.approx(bounds.gamma(512, 2.0**-24), rel=1e-12)
    cfg = nvl.GemvConfig(64, 1, 256, 4, 4, 1)
    name = nvl.accumulation_model(cfg, 8192)
    assert name == "splitk(fp32_rn_block16, 2048)"
    e = bounds.get_model(name).eps(8192)
    u = 2.0**-24
    assert e == pytest.approx(bounds.gamma(128, u) + bounds.gamma(3, u) * (1 + bounds.gamma(128, u)))
    assert e < bounds.get_model(nvl.NUMERIC_CONTRACT.model).eps(8192)
    with pytest.raises(TypeError, match="config"):
        nvl.accumulation_model("gemv", 16)
    with pytest.raises(ValueError, match="K"):
        nvl.accumulation_model(cfg, 24)


def test_pick_config_serves_each_M_by_its_path():
    """INTERPRETER_CONFIGS (the tl paths): the GEMV at M = 1, the tensor-core kernel up to M = 256, the pre-pass
    above; on a GPU the DP4A path at M = 1 and the Gluon path at every other M where they fit N and K (the tl
    paths where they do not); the contract picks the same config and gives
    each its own model (what fp4ref verify asks)."""
    paths = {m: type(nvl.pick_config(m, 8192, 8192, interpreter=True)) for m in (1, 2, 16, 64, 256, 257, 16384)}
    assert paths == {1: nvl.GemvConfig, 2: nvl.TensorCoreConfig, 16: nvl.TensorCoreConfig, 64: nvl.TensorCoreConfig,
                     256: nvl.TensorCoreConfig, 257: nvl.PrepassConfig, 16384: nvl.PrepassConfig}
    gpu = {m: type(nvl.pick_config(m, 8192, 8192, interpreter=False)) for m in (1, 2, 3, 16, 64, 256, 257, 16384)}
    assert gpu == {1: nvl.Dp4aConfig, 2: nvl.GluonConfig, 3: nvl.GluonConfig, 16: nvl.GluonConfig, 64: nvl.GluonConfig,
                   256: nvl.GluonConfig, 257: nvl.GluonConfig, 16384: nvl.GluonConfig}
    assert type(nvl.pick_config(1024, 8192, 8192 + 64, interpreter=False)) is nvl.PrepassConfig  # K % 256 != 0
    # K not a multiple of 256 (or of 256 * SPLIT_K): the tl paths serve it on a GPU too
    assert type(nvl.pick_config(1, 8192, 8192 + 128, interpreter=False)) is nvl.GemvConfig
    assert type(nvl.pick_config(8, 4096, 768, interpreter=False)) is nvl.TensorCoreConfig  # 3 steps, SPLIT_K 2
    c = nvl.NUMERIC_CONTRACT
    assert c.config_for(1, 8192, 8192, True) == nvl.pick_config(1, 8192, 8192, interpreter=True)
    assert c.model_for(c.config_for(1, 8192, 8192, True), 8192, M=1, N=8192).name == "splitk(fp32_rn_block16, 2048)"
    assert c.model_for(c.config_for(1, 8192, 8192, False), 8192).name == "splitk(fp32_rn_block16, 4096)"
    assert c.model_for(c.config_for(3, 8192, 8192, False), 8192).name == "splitk(hopper_fp16_wgmma, 4096)"
    assert c.model_for(c.config_for(64, 8192, 8192, True), 8192).name == "hopper_fp16_wgmma"
    assert c.model_for(c.config_for(64, 8192, 8192, False), 8192).name == "hopper_fp16_wgmma"
    assert c.model_for(c.config_for(4096, 8192, 8192, True), 8192, interpreter=True).name == "fp32_rn"
    assert c.model_for(c.config_for(4096, 8192, 8192), 8192).name == "hopper_fp16_wgmma"
    for cfg in nvl.CONFIGS.configs() + nvl.INTERPRETER_CONFIGS.configs():  # the contract bounds every config
        assert bounds.get_model(nvl.accumulation_model(cfg, 8192)).eps(8192) <= bounds.get_model(c.model).eps(8192)


def test_sync_words_are_left_at_zero():
    """The split-K tile counters are reset by the kernels themselves."""
    rng = np.random.default_rng(11)
    x = _to_torch(rng.standard_normal((1, 3, 128)).astype(np.float32).astype(ml_dtypes.bfloat16))
    wq = ref_quantize(rng.standard_normal((64, 128), dtype=np.float32), recipe="sol")
    nvl.nvfp4_quantize(x)
    cfg = nvl.TensorCoreConfig(BLOCK_N=64, BLOCK_M=16, BLOCK_K=32, SPLIT_K=4, num_warps=4, num_stages=2)
    nvl.nvfp4_linear(x, torch.from_numpy(wq.codes).to(DEVICE), torch.from_numpy(wq.scales).to(DEVICE),
                     float(wq.global_decode_scale), config=cfg)
    words = _runtime.workspace(x.device, _runtime.current_stream(x.device), tensorcore.COUNTERS_WORKSPACE, 0,
                               torch.int32, zeroed=True)
    assert words.numel() >= 4096  # the counters the launch used (not a fresh one-element buffer)
    assert int(torch.count_nonzero(words)) == 0


def test_contract_names_fp4ref_models():
    for name in (nvl.NUMERIC_CONTRACT.model, nvl.NUMERIC_CONTRACT.model_interpreter):
        bounds.get_model(name)  # raises on an unknown name
    assert nvl.NUMERIC_CONTRACT.notes["quantize_recipe"] == "sol"
    assert nvl.NUMERIC_CONTRACT.epilogue_multiplies == 2


def test_bench_sanity_reference_equals_fp4ref_quantization():
    """The benchmark sweep's reference (nvfp4_linear.bench.torch_dequant_linear with w_u8=None: x's recipe in torch
    ops) equals fp4ref's "sol" quantization bit for bit, on an x whose amax makes torch's ``2688.0 / amax``
    (computed by torch as reciprocal(amax) * 2688, two roundings) differ from the recipe's IEEE division. That
    ulp in the global encode scale made every M = 64 candidate of the first GPU sweep "WRONG" (max |y - ref| 9.01
    against 3.53 allowed) while the kernel matched fp4ref (fp4ref verify, M = 64: 100% bitwise-equal)."""
    from fp4ref.kernels.nvfp4_linear import bench as b

    def f32(v):
        return np.float32(v)

    # a bf16 amax in [4, 8) for which reciprocal-then-multiply is not the IEEE quotient
    cands = np.arange(0x4080, 0x4100, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    amax = next(a for a in cands if f32(2688.0) / a != f32(f32(1.0) / a) * f32(2688.0))
    at = torch.tensor(amax)
    assert not torch.equal(2688.0 / at, torch.full_like(at, 2688.0) / at)  # the torch behaviour guarded against
    rng = np.random.default_rng(64)
    x_np = (rng.standard_normal((8, 256)) * (amax / 5)).clip(-amax * 0.99, amax * 0.99).astype(ml_dtypes.bfloat16)
    x_np[3, 17] = ml_dtypes.bfloat16(-amax)
    xq = ref_quantize(x_np, recipe="sol")
    lut = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
    codes = np.stack([xq.codes & 0xF, xq.codes >> 4], -1).reshape(8, 256)
    want = (lut[codes].reshape(8, 16, 16) * xq.scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32)[..., None])
    xd, gdec = b.torch_dequant_linear(torch.from_numpy(x_np.view(np.int16)).view(torch.bfloat16), None, None, 1.0)
    assert np.float32(gdec.item()).view(np.uint32) == np.float32(xq.global_decode_scale).view(np.uint32)
    got = xd.float().numpy().reshape(8, 16, 16)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_bench_picks_install_and_check(monkeypatch):
    """The GPU benchmark's tune path without a GPU: picks (an in-kernel config, a pre-pass config) installed as
    the defaults, then the benchmark's own correctness check (fp4ref bound, NaN poison, determinism, quantizer
    bytes) passes on them, at N = K = 64. Guards the one-command GPU run against logic errors."""
    from fp4ref.kernels.nvfp4_linear import bench as b

    from fp4ref.kernels.nvfp4_linear import configs

    monkeypatch.setattr(b, "DEVICE", DEVICE)
    monkeypatch.setattr(b, "N", 64)
    monkeypatch.setattr(b, "K", 64)
    for mod in (configs, nvl):  # restored after the test (the picks replace the tables)
        monkeypatch.setattr(mod, "CONFIGS", configs.CONFIGS)
        monkeypatch.setattr(mod, "INTERPRETER_CONFIGS", configs.INTERPRETER_CONFIGS)
        monkeypatch.setattr(mod, "QUANTIZE_CONFIGS", configs.QUANTIZE_CONFIGS)
    w = b._setup()
    best = {1: (nvl.TensorCoreConfig(64, 16, 64, 2, 4, 2, DECODE_BITS=True), 1.0),
            32: (nvl.PrepassConfig(gemm=TmaConfig(64, 32, 32, num_warps=4, num_stages=2)), 1.0)}
    default_16 = nvl.pick_config(16, 64, 64)  # M = 16: no valid candidate in this "sweep": keeps the in-file default
    b._install_picks(best, {1: ((1, 64, 4), 1.0), 32: ((8, 1024, 4), 1.0)}, ms=(1, 16, 32))
    try:
        assert nvl.pick_config(1, 64, 64) == best[1][0] and nvl.pick_config(33, 64, 64) == best[32][0]
        assert nvl.pick_config(2, 64, 64) == nvl.pick_config(16, 64, 64) == default_16
        assert nvl.pick_quantize_config(1, 64) == nvl.QuantizeConfig(1, 64, 4)
        assert nvl.pick_quantize_config(32, 64) == nvl.QuantizeConfig(32, 64, 4)
        assert b._check_picks((1, 32), *w, quant_ms=(1, 32))
        assert all(b._cfg_from_json(b._cfg_json(c)) == c for c in b.all_linear_candidates())
    finally:
        _runtime.clear_plans()  # plans made with the installed picks


def test_sweep_candidates_include_the_shipped_row():
    """bench --sweep times the CONFIGS row of every M it sweeps (the M = 9-16 row, EARLY_START=False, was in no
    candidate, so a sweep could only replace it with a slower one)."""
    from fp4ref.kernels.nvfp4_linear import bench as b

    for m in (1, 2, 3, 4, 8, 9, 16, 17, 64, 100, 256, 300, 512, 768, 1024, 16384):
        assert nvl.pick_config(m, 8192, 8192, interpreter=False) in b.linear_candidates(m), m


# ----------------------------------------------------------------------------------------- sm_90 compilation


# what the GPU benchmark may pick: every candidate must build for sm_90 (kernels/nvfp4_linear/bench.py)
def _bench_candidates():
    from fp4ref.kernels.nvfp4_linear import bench as b

    return b.all_linear_candidates(), b.QUANT_TILES


LINEAR_CANDIDATES, QUANT_TILE_CANDIDATES = _bench_candidates()


def _compile_all():
    from fp4ref.kernels._sm90 import compile_for_sm90

    built = []
    lin_sig = {"w_ptr": "*i32", "ws_ptr": "*u8", "a_ptr": "*fp16", "xgdec_ptr": "*fp32", "out_ptr": "*bf16",
               "part_ptr": "*fp32", "count_ptr": "*i32", "w_gdec": "fp32", "M": "i32", "N": "i32", "K": "i32"}
    tabled = nvl.CONFIGS.configs() + nvl.INTERPRETER_CONFIGS.configs()  # Gluon: tests/test_kernel_nvfp4_gluon.py
    cfgs = [c for c in tabled + _SMALL_CONFIGS if isinstance(c, nvl.TensorCoreConfig)]
    variants = [(cfg, bk, False) for cfg in cfgs for bk in sorted({cfg.BLOCK_K, 16})]
    variants += [(c, c.BLOCK_K, False) for c in LINEAR_CANDIDATES
                 if isinstance(c, nvl.TensorCoreConfig) and c not in cfgs]
    variants += [(cfg, cfg.BLOCK_K, True) for cfg in tabled
                 if isinstance(cfg, nvl.TensorCoreConfig)]  # scales as words (prepared)
    for cfg, block_k, words in variants:
        built.append(compile_for_sm90(
            tensorcore.nvfp4_linear_kernel, dict(lin_sig, ws_ptr="*i32" if words else "*u8"),
            dict(BLOCK_N=cfg.BLOCK_N, BLOCK_M=cfg.BLOCK_M, BLOCK_K=block_k, SPLIT_K=cfg.SPLIT_K, DECODE_PTX=True,
                 SCALE_WORDS=words, DECODE_BITS=cfg.DECODE_BITS),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            divisible_by_16=["w_ptr", "ws_ptr", "a_ptr", "xgdec_ptr", "out_ptr", "part_ptr", "count_ptr", "N",
                             "K"]))  # as at run time
    # M == 1 is specialised to a constant by the runtime: the split-K epilogue must compile with it
    cfg = nvl.INTERPRETER_CONFIGS.pick(16)
    built.append(compile_for_sm90(
        tensorcore.nvfp4_linear_kernel, {k: v for k, v in lin_sig.items() if k != "M"},
        dict(M=1, BLOCK_N=cfg.BLOCK_N, BLOCK_M=cfg.BLOCK_M, BLOCK_K=cfg.BLOCK_K, SPLIT_K=cfg.SPLIT_K, DECODE_PTX=True,
             SCALE_WORDS=False, DECODE_BITS=cfg.DECODE_BITS),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        divisible_by_16=["w_ptr", "ws_ptr", "a_ptr", "xgdec_ptr", "out_ptr", "part_ptr", "count_ptr", "N", "K"]))
    # every GEMV config (defaults, tests, sweep candidates), as the runtime specialises it: M = 1 a constant
    gemv_sig = dict(lin_sig, w_ptr="*i64", a_ptr="*fp32", KB="i32")
    gemv_cfgs = {c for c in tabled + _SMALL_CONFIGS + _GEMV_CONFIGS + list(LINEAR_CANDIDATES)
                 if isinstance(c, nvl.GemvConfig)}
    for cfg in sorted(gemv_cfgs, key=repr):
        sig, ce = (({k: v for k, v in gemv_sig.items() if k != "M"}, {"M": 1}) if cfg.BLOCK_M == 1
                   else (gemv_sig, {}))
        built.append(compile_for_sm90(
            gemv.nvfp4_gemv_kernel, sig,
            dict(ce, BLOCK_N=cfg.BLOCK_N, BLOCK_M=cfg.BLOCK_M, BLOCK_K=cfg.BLOCK_K, SPLIT_K=cfg.SPLIT_K,
                 VEC=min(gemv.GEMV_VEC, cfg.BLOCK_K // 16)),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_reflect_ftz=False,
            divisible_by_16=["w_ptr", "ws_ptr", "a_ptr", "xgdec_ptr", "out_ptr", "part_ptr", "count_ptr", "N", "K",
                             "KB"]))
    built.append(compile_for_sm90(quantize.amax_kernel, {"x_ptr": "*bf16", "part_ptr": "*i32", "numel": "i32",
                                                         "ITERS": "i32"},
                                  dict(BLOCK=quantize.AMAX_BLOCK), num_warps=8))
    # the weight pre-pass: the default tile and every tile a config or the sweep may use, both modes
    prepass_cfgs = [c for c in tabled + _SMALL_CONFIGS + list(LINEAR_CANDIDATES) if isinstance(c, nvl.PrepassConfig)]
    tiles = {(c.BLOCK_R, c.BLOCK_C, c.num_warps, c.mode) for c in prepass_cfgs}
    for br, bc, nw, mode in sorted(tiles):
        kern, wty, ce = ((prepass.nvfp4_decode_weight_kernel, "*u8", {}) if mode == "fp32" else
                         (prepass.nvfp4_decode_weight_words_kernel, "*i32", {"DECODE_PTX": True}))
        built.append(compile_for_sm90(kern, {"w_ptr": wty, "ws_ptr": "*u8", "out_ptr": "*fp16", "N": "i32", "K": "i32"},
                                      dict(BLOCK_R=br, BLOCK_C=bc, **ce), num_warps=nw,
                                      divisible_by_16=["w_ptr", "ws_ptr", "out_ptr", "N", "K"]))
    defaults = sorted({dataclasses.astuple(nvl.pick_quantize_config(m, 8192))[:3] for m in (1, 4, 8192)})
    modes = ((True, False, "*fp16"), (False, True, "*fp16"), (False, True, "*fp32"))  # fp32: the GEMV's x
    jobs = [(mode, t, False) for mode in modes for t in defaults]
    jobs += [(modes[0], t, False) for t in QUANT_TILE_CANDIDATES if t not in defaults]  # what the sweep times
    one = [quantize.one_launch_tile(*mk) for mk in ((1, 8192), (4, 2048), (1, 256), (2, 1024))]
    jobs += [(mode, t, True) for mode in modes for t in one]
    # the Gluon path's quantizer (permuted fp16 x) triggers the GEMM's launch at its start (1) or after its
    # stores (2, GluonConfig.EARLY_START False); the others never (0)
    jobs = [(mode, t, sa, int(mode[1] and mode[2] == "*fp16" and t[1] % 256 == 0)) for mode, t, sa in jobs]
    jobs += [(mode, t, sa, 2) for mode, t, sa, trig in jobs if trig == 1]
    # the DP4A path's quantizer: int8 codes + scale bytes, triggering the GEMM at its start (as nvfp4_linear runs it)
    jobs = [(mode, t, sa, trig, False) for mode, t, sa, trig in jobs]
    jobs += [((True, False, "*fp16"), t, sa, 1, True) for t, sa in [(one[0], True), (defaults[0], False)]]
    jobs = [(*job, False, 0) for job in jobs]
    # the one-launch forms: grid barrier (cooperative; the tiles of M = 2 .. 256 at K = 8192 on 132 SMs) and
    # read-all (M = 2 and 8: x padded to 2 or 8 rows x 8192), as nvfp4_quantize (packed), the Gluon path (permuted
    # fp16, trigger at the start or after the stores) and the DP4A path (M = 1, or chosen at M = 2) run them
    for tiles, grid_sync in (([nvl.grid_sync_config(m, 8192, 132) for m in (2, 16, 65, 256)], True),
                             ([nvl.read_all_config(m, 8192) for m in (2, 8)], False)):
        for i, t in enumerate(sorted({dataclasses.astuple(c)[:3] for c in tiles})):
            read_all = 0 if grid_sync else t[0]  # the read-all form's padded rows (x's columns: 8192)
            jobs += [(modes[0], t, False, 0, False, grid_sync, read_all)]
            jobs += [(modes[1], t, False, trig, False, grid_sync, read_all) for trig in (1, 2)]
            if i == 0:
                jobs += [((True, False, "*fp16"), t, False, 1, True, grid_sync, read_all)]
    # the cluster form (one cluster of 16 programs; the tiles of M = 2, 8 and 16 at K = 8192), run as the
    # grid and read-all forms are; and narrow tiles of small K (K = 256 at M = 64 and 512), packed
    for i, t in enumerate(sorted({dataclasses.astuple(nvl.cluster_config(m, 8192))[:3] for m in (2, 8, 16)})):
        jobs += [(modes[0], t, False, 0, False, False, 0, 16)]
        jobs += [(modes[1], t, False, trig, False, False, 0, 16) for trig in (1, 2)]
        if i == 0:
            jobs += [((True, False, "*fp16"), t, False, 1, True, False, 0, 16)]
    jobs += [(modes[0], dataclasses.astuple(nvl.cluster_config(m, 256))[:3], False, 0, False, False, 0, 16)
             for m in (64, 512)]
    jobs = [(job if len(job) == 8 else (*job, 0), "*bf16") for job in jobs]
    # nvfp4_quantize of an fp32 x through the largest read-all tile: all of x (256 fp32 per thread) without spills
    jobs += [((modes[0], dataclasses.astuple(nvl.read_all_config(8, 8192))[:3], False, 0, False, False, 8, 0),
              "*fp32")]
    for ((write_packed, write_dequant, deq), (br, bc, nw), self_amax, trigger, int8_codes, grid_sync,
         read_all, cluster), x_type in jobs:
        built.append(compile_for_sm90(
            quantize.nvfp4_quantize_kernel,
            {"x_ptr": x_type, "amax_ptr": "*i32", "q_ptr": "*u8", "s_ptr": "*u8", "deq_ptr": deq,
             "gdec_ptr": "*fp32", "w_gdec": "fp32", "M": "i32", "K": "i32", "stride_xm": "i32", "n_amax": "i32"},
            dict(BLOCK_R=br, BLOCK_C=bc, WRITE_PACKED=write_packed, WRITE_DEQUANT=write_dequant,
                 AMAX_PARTS=quantize.AMAX_MAX_PROGRAMS, PERMUTE_K=write_dequant and bc % 256 == 0,
                 SELF_AMAX=self_amax, GRID_SYNC=grid_sync, TRIGGER_DEPENDENTS=trigger, INT8_CODES=int8_codes,
                 READ_ALL_R=read_all, READ_ALL_C=8192 if read_all else 0, CLUSTER_CTAS=cluster),
            num_warps=nw, enable_fp_fusion=False, enable_reflect_ftz=False, launch_cooperative_grid=grid_sync,
            divisible_by_16=["x_ptr", "amax_ptr", "q_ptr", "s_ptr", "deq_ptr", "gdec_ptr", "K", "stride_xm"]))
    # the large-M path's GEMM tiles (fp16 operands, bf16 output, epilogue scale): defaults and bench candidates
    gemms = {c.gemm for c in prepass_cfgs}
    from fp4ref.kernels.gemm_fp16 import tma as gemm_fp16_tma

    for g in sorted(gemms, key=repr):
        bm, bn, bk, sub = g.BLOCK_M, g.BLOCK_N, g.BLOCK_K, g.EPILOGUE_SUBTILE
        built.append(compile_for_sm90(
            gemm_fp16_tma.gemm_fp16_tma_kernel,
            {"a_desc": f"tensordesc<fp16[{bm}, {bk}]>", "b_desc": f"tensordesc<fp16[{bn}, {bk}]>",
             "c_desc": f"tensordesc<bf16[{bm}, {bn // sub}]>", "ws_ptr": "*fp32", "cnt_ptr": "*i32",
             "scale_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32"},
            dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=g.SPLIT_K, GROUP_M=g.GROUP_M, NUM_PROGRAMS=132,
                 HAS_SCALE=True, EPILOGUE_SUBTILE=sub),
            num_warps=g.num_warps, num_stages=g.num_stages, divisible_by_16=["ws_ptr", "cnt_ptr", "N", "K"]))
    return built


def test_every_config_compiles_for_sm90():
    from fp4ref.kernels._sm90 import SM90_MAX_SHARED_BYTES

    built = _compile_all()
    for ck in built:
        assert ck.asm["cubin"]
        assert ck.metadata.shared <= SM90_MAX_SHARED_BYTES
    for ck in built:
        ptx = ck.asm["ptx"]
        if "nvfp4_linear_kernel" in ck.metadata.name:  # the PTX decode path is the one compiled
            assert ("prmt.b32 p0, lo, hi, 0x5140" in ptx) != ("prmt.b32 t, w, u, 0x3377" in ptx)
        if ck.metadata.name == "nvfp4_decode_weight_words_kernel":  # PTX decode, 16-byte stores
            assert "cvt.rn.f16x2.e4m3x2" in ptx and "st.global.v4.b32" in ptx
    # the GEMV keeps fp32 subnormals (its decode makes E2M1(c) * 2^-126, subnormal for |c| = 0.5): no .ftz; and
    # its decoded weights stay in registers (no shared-memory layout conversion)
    gbuilds = [ck for ck in built if ck.metadata.name == "nvfp4_gemv_kernel"]
    assert gbuilds
    for ck in gbuilds:
        assert ".ftz" not in ck.asm["ptx"] and "fma.rn.f32" in ck.asm["ptx"]
        assert ck.metadata.shared <= 1024
    # the quantizer's divisions are IEEE (div.rn.f32, no .ftz): the recipe's bytes depend on it
    qbuilds = [ck for ck in built if ck.metadata.name == "nvfp4_quantize_kernel"]
    assert qbuilds
    for ck in qbuilds:
        qptx = ck.asm["ptx"]
        assert "div.rn.f32" in qptx and "div.rn.ftz" not in qptx and "div.full" not in qptx
        assert "div.approx" not in qptx
    # the Gluon and DP4A paths' quantizer lets the GEMM launch: one launch_dependents, before any global load
    # (start) or after every global store (after its stores)
    triggers = [ck.asm["ptx"] for ck in qbuilds if "griddepcontrol.launch_dependents" in ck.asm["ptx"]]
    assert 0 < len(triggers) < len(qbuilds)
    starts = ends = 0
    for qptx in triggers:
        assert qptx.count("griddepcontrol.launch_dependents") == 1
        before, after = qptx.split("griddepcontrol.launch_dependents")
        starts += "ld.global" not in before
        ends += "st.global" not in after and "ld.global" in before
    # (the DP4A path's quantizer triggers at its start only: its five builds are the starts beyond the pairs)
    assert starts + ends == len(triggers) and starts == ends + 5
    # the grid form: cooperative launch; the partial written to L2 before the acq_rel arrival, the last arrival
    # resets the count then releases the generation, the others spin on an acquire read of it, and the partials
    # are read from L2 after the barrier. The other forms have no atomics.
    grid = [ck for ck in qbuilds if ck.metadata.launch_cooperative_grid]
    assert len(grid) == 4 * 3 + 1  # 4 tiles x (packed, fp16 x 2 triggers), and the DP4A form
    for ck in qbuilds:
        qptx = ck.asm["ptx"]
        if ck not in grid:
            assert "atom." not in qptx and "ld.global.gpu.acquire" not in qptx
            continue
        store = qptx.index("st.global.cg.b32")
        arrive = qptx.index("atom.global.gpu.acq_rel.add.u32")
        reset = qptx.index("atom.global.gpu.relaxed.exch.b32")
        release = qptx.index("atom.global.gpu.release.add.u32")
        assert store < qptx.index("ld.global.gpu.acquire.b32") < arrive < reset < release
        assert "ld.global.gpu.acquire.b32" in qptx[release:] and "ld.global.cg.b32" in qptx[release:]
    # the cluster form: the 16 amax slots in static shared memory; a relaxed arrival first, then (after the tile's
    # loads) the wait, one store into another CTA's slot, a release / acquire barrier, and no global atomics
    clustered = [ck.asm["ptx"] for ck in qbuilds if "barrier.cluster" in ck.asm["ptx"]]
    assert len(clustered) == 3 * 3 + 1 + 2  # 3 tiles x (packed, fp16 x 2 triggers), the DP4A form, 2 narrow
    for qptx in clustered:
        assert qptx.count(".shared .align 16 .b32 fp4ref_amax_slots[16];") == 1
        assert qptx.count("mapa.shared::cluster.u32") == qptx.count("st.shared::cluster.u32") == 1
        arrive = qptx.index("barrier.cluster.arrive.relaxed.aligned")
        wait = qptx.index("barrier.cluster.wait.aligned")
        store = qptx.index("st.shared::cluster.u32")
        release = qptx.index("barrier.cluster.arrive.release.aligned")
        assert arrive < qptx.index("ld.global") < wait < store < release < qptx.index("barrier.cluster.wait.acquire")
        assert qptx.count("barrier.cluster") == 4 and "atom." not in qptx
    # no quantizer build spills (the read-all form keeps all of x, up to 256 elements per thread, in registers)
    from fp4ref.kernels._sm90 import sass_info

    for ck in qbuilds:
        info = sass_info(ck.asm["cubin"])
        assert info["spill_stores"] == 0 and info["spill_loads"] == 0, (ck.metadata.num_warps, info)


# --------------------------------------------------------------------------------------------- GPU: workload

WORKLOAD_M = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@pytest.fixture(scope="module")
def workload_weight():
    """The workload's weights: randn fp32 [8192, 8192] quantized with the 'sol' recipe (fp4ref, numpy)."""
    wq = ref_quantize(np.random.default_rng(1234).standard_normal((8192, 8192), dtype=np.float32), recipe="sol")
    return wq, torch.from_numpy(wq.codes).cuda(), torch.from_numpy(wq.scales).view(torch.float8_e4m3fn).cuda()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", WORKLOAD_M)
def test_workload_sizes_on_gpu(m, workload_weight, record_property):
    wq, wc, ws = workload_weight
    rng = np.random.default_rng(m)
    x_np = rng.standard_normal((1, m, 8192)).astype(np.float32).astype(ml_dtypes.bfloat16)
    x = _to_torch(x_np)
    # the quantizer, whole tensor, against fp4ref
    xq = ref_quantize(x_np.reshape(m, 8192), recipe="sol")
    _assert_quantize_equal(x_np.reshape(m, 8192), xq)
    # the linear layer, NaN-poisoned output, checked on a row subset against the exact NVFP4 product
    out = torch.full((1, m, 8192), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = nvl.nvfp4_linear(x, wc, ws, float(wq.global_decode_scale), out=out)
    # repeated calls (the second and later ones take the cached launch plan): bitwise equal
    for _ in range(3):
        y2 = nvl.nvfp4_linear(x, wc, ws, float(wq.global_decode_scale))
        torch.cuda.synchronize()
        assert torch.equal(y.view(torch.int16), y2.view(torch.int16)), "not bitwise deterministic"
    rows = np.unique(np.concatenate([np.arange(min(m, 48)), np.arange(max(0, m - 16), m),
                                     rng.choice(m, size=min(m, 64), replace=False)]))
    xs = dataclasses.replace(xq, codes=xq.codes[rows], scales=xq.scales[rows], shape=(len(rows), 8192))
    ref = gemm.nvfp4_gemm(xs, wq)
    got = _bf16_to_numpy(y.reshape(m, 8192)[torch.from_numpy(rows).cuda()])
    report = bounds.check(got, ref, MODEL, output_rounding=ROUNDING, poison=float("nan"))
    unwritten = int(torch.isnan(y).sum().item())
    sol = testing.sol_allclose(got, ref.out)
    record_property("report", report.summary())
    print(f"M={m}: max err/bound {report.max_err_over_bound:.3g}, bitwise-equal "
          f"{100 * report.bitwise_equal_fraction:.2f}%, NaN anywhere {unwritten}, SOL tolerance matched "
          f"{100 * sol.matched_fraction:.3f}% ({'pass' if sol.ok else 'FAIL'})")
    assert unwritten == 0
    assert report.ok, report.message()
