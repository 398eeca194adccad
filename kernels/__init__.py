"""Triton kernels for the three fp4ref workloads (imports torch and triton).

Installed as ``fp4ref.kernels``. Nothing here runs at import time beyond defining kernels.
"""
