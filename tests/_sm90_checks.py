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
