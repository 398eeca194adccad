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
