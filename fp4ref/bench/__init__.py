"""CPU benchmarks of the library (codecs, NVFP4 quantization, reference GEMMs, checkpoint quantization):
``python -m fp4ref.bench.NAME``.

Not tests: each prints a table with its command and machine (docs/benchmarks.md records them).
"""
