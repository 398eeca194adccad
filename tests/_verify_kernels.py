"""Torch stand-in kernels for the verify tests: one right, and deliberately wrong ones fp4ref must flag.

Each takes the gemm_n3072_k2048 signature (A fp16 [M, K], B fp16 [N, K]) -> fp16 [M, N].
On the exact_acc family every product and partial sum is a small integer, so the float64 matmul below is exact
and ``.to(torch.float16)`` is then one RNE rounding: the right answer.
"""
import torch


def right(A, B):
    return (A.double() @ B.double().T).to(torch.float16)


def truncating_store(A, B):
    """Rounds the exact sum toward zero (a store that truncates instead of RNE)."""
    exact = A.double() @ B.double().T
    rne = exact.to(torch.float16)
    over = rne.double().abs() > exact.abs()  # RNE went away from zero: step one ulp back toward zero
    return torch.where(over, torch.nextafter(rne, torch.zeros_like(rne)), rne)


def last_column_skipped(A, B):
    """Never writes the last output column (a masked-off partial tile); the buffer held zeros."""
    out = right(A, B)
    out[:, -1] = 0
    return out


def wrong_shape(A, B):
    """Returns C transposed: the checker must reject it, not crash."""
    return right(A, B).T.contiguous()


def mutator(A, B):
    """Overwrites its inputs with zeros and returns zeros: must fail (the reference is taken before the call)."""
    A.zero_()
    B.zero_()
    return torch.zeros((A.shape[0], B.shape[0]), dtype=torch.float16)


def exits(A, B):
    raise SystemExit(0)


def returns_none(A, B):
    return None


def meta_output(A, B):
    """Returns a meta tensor (no data): the output cannot be read."""
    return torch.empty((A.shape[0], B.shape[0]), dtype=torch.float16, device="meta")


def raises_long(A, B):
    """Raises with a message longer than any console line: the JSON report must keep all of it."""
    raise RuntimeError("x" * 300 + " END-OF-MESSAGE")


# ----------------------------------------------------------------------------------- integrity planted bugs
# Each returns correct values on its first call, so only its integrity verdict may fail.

_calls = {"n": 0}
_cache: dict = {}
_static: dict = {}


def mutates_on_second_call(A, B):
    """Correct, but scribbles over its input from the second call on."""
    _calls["n"] += 1
    out = right(A, B)
    if _calls["n"] % 2 == 0:
        A[0, 0] = -A[0, 0] if A[0, 0] != 0 else 1.0
    return out


def aliases_input(A, B):
    """Returns its result in A's own memory (the bytes of A are changed too: caught both ways)."""
    out = right(A, B)
    m, n = out.shape
    view = A.reshape(-1)[: m * n].view(m, n) if A.numel() >= m * n else B.reshape(-1)[: m * n].view(m, n)
    view.copy_(out)
    return view


def pointer_cache(A, B):
    """Caches outputs keyed on the input pointers and shapes (the flashinfer-bench-starter-kit #21 bug)."""
    key = (A.data_ptr(), B.data_ptr(), tuple(A.shape), tuple(B.shape))
    if key not in _cache:
        _cache[key] = right(A, B)
    return _cache[key].clone()


def fingerprint_cache(A, B):
    """Caches outputs keyed on a cheap fingerprint of the inputs (shapes, dtypes, strides: not the values)."""
    key = ("fp", tuple(A.shape), tuple(B.shape), A.dtype, B.dtype, A.stride(), B.stride())
    if key not in _cache:
        _cache[key] = right(A, B)
    return _cache[key].clone()


def nondeterministic(A, B):
    """Correct on odd calls; on even calls one element is one ulp off (an atomics-order race)."""
    _calls["n"] += 1
    out = right(A, B)
    if _calls["n"] % 2 == 0:
        out.view(torch.int16).view(-1)[0] ^= 1
    return out


def reuses_output_buffer(A, B):
    """Writes every result into one static buffer and returns it: an earlier output changes under later calls."""
    shape = (A.shape[0], B.shape[0])
    buf = _static.setdefault(shape, torch.empty(shape, dtype=torch.float16))
    buf.copy_(right(A, B))
    return buf


class LazyTensor(torch.Tensor):
    """A torch.Tensor subclass standing in for a lazy / wrapper result type."""


def subclass_output(A, B):
    return right(A, B).as_subclass(LazyTensor)


def noncontiguous_ok(A, B):
    """A correct result stored transposed (a strided view): plain and dense, it must pass every verdict."""
    return right(B, A).T


def drops_k_tail(A, B):
    """Accumulates only whole 64-column K tiles: the partial last tile is dropped (right when 64 divides K)."""
    keep = A.shape[1] - A.shape[1] % 64
    return right(A[:, :keep], B[:, :keep])


def wrong_fourth_k_block(A, B):
    """Doubles the contribution of K columns 192..255 (one 64-column K-block): only that block matters."""
    out = A.double() @ B.double().T
    if A.shape[1] > 192:
        out += A[:, 192:256].double() @ B[:, 192:256].double().T
    return out.to(torch.float16)


# ------------------------------------------------------------- sparse_gemm_fp4_fp8 stand-ins (fp8 accumulators)


def _sparse_simulated(a_vals, a_meta, b_fp8, model):
    import ml_dtypes
    import numpy as np

    from fp4ref import bounds, gemm
    from fp4ref.packing import decompress_2to4

    A = decompress_2to4(a_vals.numpy().view(np.uint8), a_meta.numpy().view(np.uint8)).astype(np.float64)
    B = b_fp8.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    acc = gemm.round_float64(bounds.simulate(A, B, model), "bfloat16").astype(np.float32)
    return torch.from_numpy(acc).to(torch.bfloat16)  # exact: acc already holds bf16 values


def sparse_fp8_unpromoted(a_vals, a_meta, b_fp8):
    """Hopper fp8 wgmma whose 14-bit accumulator is never promoted (Triton's sm_90 default), simulated."""
    return _sparse_simulated(a_vals, a_meta, b_fp8, "hopper_fp8_wgmma")


def sparse_fp8_promoted(a_vals, a_meta, b_fp8):
    """The same accumulator promoted into fp32 every 128 products (max_num_imprecise_acc=128), simulated."""
    return _sparse_simulated(a_vals, a_meta, b_fp8, "hopper_fp8_wgmma_promote(128)")
