"""fp4ref: reference codecs, exact GEMMs and rigorous error bounds for FP4/FP8 numerics.

Pure numpy + ml_dtypes; never imports torch or triton (the Triton kernels live in ``fp4ref.kernels``).
"""
from .formats import (  # noqa: F401
    E2M1,
    E2M3,
    E3M2,
    E4M3FN,
    E5M2,
    FORMATS,
    UE8M0,
    FloatFormat,
    NanPolicy,
    Rounding,
    decode,
    encode,
    get_format,
)
from .packing import check_meta, compress_2to4, decompress_2to4, pack_fp4, unpack_fp4  # noqa: F401
from .blockscale import (  # noqa: F401
    MXMode,
    MXTensor,
    NVFP4Recipe,
    NVFP4Tensor,
    from_blocked,
    mx_dequantize,
    mx_quantize,
    nvfp4_dequantize,
    nvfp4_quantize,
    to_blocked,
)

__version__ = "0.1.0"
