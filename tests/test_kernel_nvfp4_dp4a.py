"""nvfp4_linear's DP4A path (Dp4aConfig, kernels/nvfp4_linear/dp4a.py): integer block dot products on the CUDA cores.

CPU: the decode's PTX on every byte value in every byte of a word (a model of the PTX instructions, tests/
_ptx_model.py), against fp4ref's E2M1 table; every Dp4aConfig of CONFIGS, the variants below and the benchmark's
sweep candidates built for sm_90 (TMA and dp4a in the PTX, IDP and UTMALDG in the SASS, no spills, no ptxas
advisory, shared memory within the limit); the quantizer's int8 codes (the interpreter) against fp4ref's codes;
config checks and the model.
GPU (``-m gpu``): M = 1-8 and past one x tile against fp4ref's exact NVFP4 reference (recipe "sol") under the
config's model, NaN-poisoned outputs and split-K partials, bitwise determinism; ragged N and one K step; an
exact-accumulation case equal to the correctly rounded output.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fp4ref.kernels.nvfp4_linear as nvl
from fp4ref import decode as ref_decode
from fp4ref.blockscale import nvfp4_quantize as ref_quantize
from fp4ref.kernels._sm90 import compile_for_sm90, gluon_tensordesc
from fp4ref.kernels.nvfp4_linear import dp4a
from fp4ref.kernels.nvfp4_linear.quantize import AMAX_MAX_PROGRAMS, QuantizeLaunches
from _nvfp4_gpu import (assert_exact_accumulation_is_correctly_rounded,  # tests/_nvfp4_gpu.py
                        assert_within_bound_and_deterministic, x_bf16)
from _ptx_model import run_ptx  # tests/_ptx_model.py
from _sm90_checks import assert_gluon_build  # tests/_sm90_checks.py
from _marks import INTERPRETER_ONLY  # tests/_marks.py

D = nvl.Dp4aConfig
CUDA = torch.cuda.is_available()
TABLE = [c for c in nvl.CONFIGS.configs() if isinstance(c, D)]
VARIANTS = [D(BN=64, BM=1, SPLIT_K=1, STAGES=2), D(BN=128, BM=4, SPLIT_K=2, STAGES=3, num_warps=8),
            D(BN=32, BM=8, SPLIT_K=8, STAGES=5), D(BN=64, BM=2, SPLIT_K=4, STAGES=4, EARLY_START=False)]


# ----------------------------------------------------------------------------------------------------------- CPU
def test_decode_int8_ptx_every_byte():
    """DECODE_INT8_PTX on every byte value in every byte of the word (random bytes around it): output byte i of
    $0 (codes 0-3) and $1 (codes 4-7) is 2 E2M1(code i) as a signed byte, from fp4ref's E2M1 table."""
    rng = np.random.default_rng(3)
    words = []
    for byte in range(4):
        w = rng.integers(0, 2**32, 256, dtype=np.uint64).astype(np.uint32)
        w = (w & np.uint32(~(0xFF << (8 * byte)) & 0xFFFFFFFF)) | (np.arange(256, dtype=np.uint32) << (8 * byte))
        words.append(w)
    w = np.concatenate(words + [rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)])
    tables = {f"${3 + i}": v for i, v in enumerate(dp4a.TABLE_WORDS.value)}
    out = run_ptx(dp4a.DECODE_INT8_PTX.value, {"$2": w, **tables})
    for half in range(2):
        got = out[f"${half}"].astype(np.uint32)
        for i in range(4):
            code = ((w >> (4 * (4 * half + i))) & 0xF).astype(np.uint8)
            want = (2 * ref_decode(code, "e2m1").astype(np.float64)).astype(np.int64)
            got_i = ((got >> (8 * i)) & 0xFF).astype(np.uint8).view(np.int8)
            bad = np.flatnonzero(got_i != want)
            assert bad.size == 0, (f"word {w[bad[0]]:#010x} code {4 * half + i}: got {got_i[bad[0]]}, "
                                   f"want {want[bad[0]]}")
    assert list(dp4a.E2M1_X2) == (2 * ref_decode(np.arange(8, dtype=np.uint8), "e2m1")).astype(int).tolist()


def _build(cfg, pdl=True):
    wl, sl, xl, xsl = dp4a.shared_layouts()
    sig = {"w_desc": gluon_tensordesc("u8", [cfg.BN, 128], wl), "s_desc": gluon_tensordesc("u8", [cfg.BN, 16], sl),
           "x_desc": gluon_tensordesc("i8", [cfg.BM, 256], xl),
           "xs_desc": gluon_tensordesc("u8", [cfg.BM, 16], xsl), "gdec_ptr": "*fp32", "out_ptr": "*bf16",
           "part_ptr": "*fp32", "count_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32"}
    ce = dict(BN=cfg.BN, BM=cfg.BM, SPLIT_K=cfg.SPLIT_K, STAGES=cfg.STAGES, num_warps=cfg.num_warps, PDL=pdl)
    return compile_for_sm90(dp4a.nvfp4_dp4a_kernel, sig, ce, num_warps=cfg.num_warps,
                            divisible_by_16=["gdec_ptr", "out_ptr", "part_ptr", "count_ptr", "N", "K"])


def _sweep_candidates():
    from fp4ref.kernels.nvfp4_linear import bench

    return [c for c in bench.all_linear_candidates() if isinstance(c, D) and c not in TABLE + VARIANTS]


@pytest.mark.parametrize("cfg", TABLE + VARIANTS + _sweep_candidates(), ids=repr)
def test_dp4a_config_builds_for_sm90(cfg):
    """Every tabled config, the variants the GPU tests run and every config the benchmark's sweep may pick."""
    assert_gluon_build(_build(cfg), mma="dp4a")


def test_dp4a_pdl_build_waits_before_x():
    """Under programmatic dependent launch the producer issues the W part of the first STAGES steps before its
    griddepcontrol.wait, x only after it; the consumers wait too before they read gdec (the wait is per thread);
    without PDL there is no wait."""
    cfg = VARIANTS[1]
    ptx = _build(cfg).asm["ptx"]
    assert ptx.count("griddepcontrol.wait") == 2
    first_copy = ptx.index("cp.async.bulk.tensor")  # the PTX holds the consumers' code first, then the producer's
    consumers, producer = ptx[:first_copy], ptx[first_copy:]
    before, after = consumers.split("griddepcontrol.wait")
    assert "ld.global" not in before and "ld.global" in after  # gdec (and split-K partials) only after the wait
    before, after = producer.split("griddepcontrol.wait")
    assert before.count("cp.async.bulk.tensor") == 2 * cfg.STAGES  # W codes + scales per prologue step
    assert after.count("cp.async.bulk.tensor") == 2 * cfg.STAGES + 4  # their x, then the loop's four copies
    assert "griddepcontrol" not in _build(cfg, pdl=False).asm["ptx"]


@INTERPRETER_ONLY
def test_dp4a_config_checks_and_model():
    for bm in (3, 16, 0):
        with pytest.raises(ValueError, match="BM"):
            D(BM=bm)
    for bad in (dict(BM=True), dict(BM=2.0), dict(STAGES=4.0), dict(BN=64.0)):
        with pytest.raises(TypeError, match=next(iter(bad))):
            D(**bad)
    with pytest.raises(ValueError, match="BN"):
        D(BN=16, num_warps=8)  # 8 warps of 4 row lanes need 32 rows
    with pytest.raises(ValueError, match="num_warps"):
        D(BN=64, num_warps=2)  # warp specialization: whole warpgroups
    for st in (1, 0):  # one message for both: an int >= 2
        with pytest.raises(ValueError, match=f"STAGES={st}: expected an int >= 2"):
            D(STAGES=st)
    with pytest.raises(ValueError, match="SPLIT_K"):
        D(SPLIT_K=3)
    with pytest.raises(TypeError, match="EARLY_START"):
        D(EARLY_START=1)
    assert D(SPLIT_K=4).fits(8192, 8192) and not D(SPLIT_K=4).fits(8192, 768) and not D().fits(64, 8192 + 128)
    assert nvl.accumulation_model(D(SPLIT_K=4), 8192) == "splitk(fp32_rn_block16, 2048)"
    assert nvl.accumulation_model(D(SPLIT_K=1), 512) == "splitk(fp32_rn_block16, 512)"
    x = torch.zeros(1, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="run on CUDA"):
        nvl.nvfp4_linear(x, torch.zeros(64, 128, dtype=torch.uint8), torch.zeros(64, 16, dtype=torch.uint8), 1.0,
                         config=D(SPLIT_K=1))


def test_quantizer_int8_codes():
    """INT8_CODES: one signed byte per element, 2 x the E2M1 value of fp4ref's code (-0 and 0 -> 0), and the same
    scale bytes as the packed form; in the interpreter on the CPU, compiled on a GPU."""
    dev = torch.device("cuda" if CUDA else "cpu")
    rng = np.random.default_rng(12)
    for M, K, cfg in ((1, 256, None), (3, 512, nvl.pick_quantize_config(3, 512))):
        x_np = rng.standard_normal((M, K)).astype(np.float32)
        x_np[0, :16] = [0.0, -0.0, 1e-3, -1e-3, 6.0, -6.0, 0.25, -0.25, 0.75, -0.75, 2.5, -2.5, 5.0, -5.0, 3.0, -4.0]
        x_np[-1, 16:32] = 0.0  # an all-zero block
        xq = ref_quantize(x_np, recipe="sol")
        x = torch.from_numpy(x_np).to(dev)
        q = QuantizeLaunches(M, K, cfg, write_packed=True, write_dequant=False, int8_codes=True)
        parts = torch.zeros(AMAX_MAX_PROGRAMS, dtype=torch.int32, device=dev)
        gdec = torch.zeros(2, dtype=torch.float32, device=dev)
        codes = torch.full((M * K,), 99, dtype=torch.int8, device=dev)  # poison: 99 is no code
        scales = torch.full((M * K // 16,), 0xFF, dtype=torch.uint8, device=dev)
        q.run(0, x, parts, codes, scales, gdec, gdec, 1.0)
        packed = xq.codes.reshape(M, K // 2)
        nib = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(M, K)
        want = (2 * ref_decode(nib.astype(np.uint8), "e2m1").astype(np.float64)).astype(np.int8)
        np.testing.assert_array_equal(codes.cpu().numpy().reshape(M, K), want)
        np.testing.assert_array_equal(scales.cpu().numpy().reshape(M, K // 16), xq.scales.reshape(M, K // 16))
        assert set(np.unique(want)) <= {0, 1, 2, 3, 4, 6, 8, 12, -1, -2, -3, -4, -6, -8, -12}
    with pytest.raises(ValueError, match="write_packed"):
        QuantizeLaunches(1, 256, None, write_packed=False, write_dequant=True, int8_codes=True)


# ----------------------------------------------------------------------------------------------------------- GPU
needs_gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (Hopper)")


@pytest.fixture(scope="module")
def weight():
    wq = ref_quantize(np.random.default_rng(98).standard_normal((2048, 8192), dtype=np.float32), recipe="sol")
    return wq, torch.from_numpy(wq.codes).cuda(), torch.from_numpy(wq.scales).view(torch.float8_e4m3fn).cuda()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("m, cfg", [(m, c) for m in (1, 2, 3, 4, 5, 8, 11) for c in TABLE + VARIANTS
                                    if m <= 2 * c.BM or c is nvl.pick_config(m, 2048, 8192, interpreter=False)])
def test_dp4a_within_bound_and_deterministic(m, cfg, weight):
    wq, wc, ws = weight
    assert_within_bound_and_deterministic(cfg, *x_bf16(m, 8192, 40 + m), wq, wc, ws)


@pytest.mark.gpu
@needs_gpu
def test_dp4a_ragged_n_and_one_step():
    """N not a multiple of BN (TMA zero-fill, clipped stores), one 256-K step, M not a multiple of BM."""
    rng = np.random.default_rng(32)
    for m, n, k, cfg in ((1, 80, 256, D(SPLIT_K=1)), (3, 1040, 512, D(BN=128, BM=2, SPLIT_K=2, num_warps=8)),
                         (6, 336, 768, D(BN=32, BM=4, SPLIT_K=1))):
        wq = ref_quantize(rng.standard_normal((n, k), dtype=np.float32), recipe="sol")
        assert_within_bound_and_deterministic(cfg, *x_bf16(m, k, n), wq, torch.from_numpy(wq.codes).cuda(),
                                              torch.from_numpy(wq.scales).cuda())


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("m", [1, 3, 8])
def test_dp4a_exact_accumulation_is_correctly_rounded(m):
    """Integer-valued block terms whose fp32 sums are exact: the output is the correctly rounded value."""
    assert_exact_accumulation_is_correctly_rounded(m, 70 + m, D(BM=1 << (m - 1).bit_length(), SPLIT_K=4))
