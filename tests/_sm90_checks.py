"""What every Gluon kernel's sm_90 build must show (shared by the Gluon path tests)."""
from __future__ import annotations

from fp4ref.kernels._sm90 import SM90_MAX_SHARED_BYTES, ptxas_advisories, sass_info


def assert_gluon_build(ck, max_spill_stores: int = 0, mma: str = "wgmma") -> dict:
    """``mma`` ("wgmma", or "dp4a" for the integer CUDA-core path) and TMA loads in the PTX; shared memory within
    the sm_90 limit; in the SASS (where triton's bundled cuobjdump reads it) HGMMA (16-bit) or QGMMA (fp8) for
    wgmma, IDP for dp4a, and UTMALDG present and at most ``max_spill_stores`` spill stores (and as many loads when
    spilling is allowed at all); no ptxas advisory (a serialized wgmma would stop the tensor cores overlapping
    anything). Returns the SASS facts."""
    __tracebackhide__ = True
    ptx = ck.asm["ptx"]
    assert {"wgmma": "wgmma.mma_async", "dp4a": "dp4a.s32.s32"}[mma] in ptx and "cp.async.bulk.tensor" in ptx
    assert ck.metadata.shared <= SM90_MAX_SHARED_BYTES
    assert ptxas_advisories(ptx) == []
    info = sass_info(ck.asm["cubin"])
    if info:
        assert (info["idp"] if mma == "dp4a" else info["hgmma"] + info["qgmma"]) > 0 and info["utmaldg"] > 0, info
        assert info["spill_stores"] <= max_spill_stores, info
        if max_spill_stores == 0:
            assert info["spill_loads"] == 0, info
    return info


def assert_cluster_build(ck, split_k: int, numel: int, num_warps: int) -> None:
    """A ``CLUSTER`` config's build (kernels/_gluon.py ``cluster_sum``): ``split_k`` CTAs per cluster; ranks 1 ..
    split_k - 1 send the accumulator's ``numel`` fp32 values (over 32 x ``num_warps`` threads) to rank 0 with
    ``st.async`` (16 bytes per store) counted on an mbarrier there; one relaxed arrival on the cluster barrier and
    one wait; the exchange buffer a static shared array of whole KiB (the dynamic shared memory keeps its
    alignment); no arrival counter or workspace atomics."""
    __tracebackhide__ = True
    from fp4ref.kernels._gluon import exchange_bytes

    ptx = ck.asm["ptx"]
    assert ck.metadata.num_ctas == split_k and f".reqnctapercluster {split_k}" in ptx
    per_thread = numel // (32 * num_warps)
    assert ptx.count("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32") == per_thread // 4
    assert ptx.count("barrier.cluster.arrive.relaxed") == 1 and ptx.count("barrier.cluster.wait") == 1
    size = exchange_bytes(numel, split_k)
    assert size % 1024 == 0 and f".shared .align 1024 .b8 fp4ref_cluster_xbuf[{size}];" in ptx
    assert ck.metadata.shared + size <= SM90_MAX_SHARED_BYTES  # (metadata.shared is the dynamic part only)
    assert "atom." not in ptx
