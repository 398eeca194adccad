"""Code tables and policy summaries of the element formats, generated from :mod:`fp4ref.formats`.

``fp4ref formats --markdown`` prints :func:`formats_markdown`; docs/formats.md is that output, and a test fails when
the committed file differs, so the documentation cannot drift from the code.
"""
from __future__ import annotations

import math

from .formats import FORMATS, E2M1, FloatFormat, code_class, decode, encode, get_format

__all__ = ["code_rows", "properties", "policies", "formats_markdown"]


def _value_str(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+inf" if v > 0 else "-inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    m, e = math.frexp(abs(v))
    if m == 0.5:  # a power of two: show the exponent too
        return f"{v!r} (= {'-' if v < 0 else ''}2^{e - 1})"
    return repr(v)


def code_rows(fmt) -> list:
    """One row per code: (hex, binary, value string, class). Values come from :func:`fp4ref.decode`."""
    fmt = get_format(fmt)
    import numpy as np

    codes = np.arange(fmt.num_codes, dtype=np.uint8)
    values = decode(codes, fmt, np.float64)
    width = (fmt.nbits + 3) // 4
    return [
        (f"0x{c:0{width}X}", format(c, f"0{fmt.nbits}b"), _value_str(float(v)), code_class(c, fmt))
        for c, v in zip(codes.tolist(), values.tolist())
    ]


def properties(fmt) -> list:
    """(name, value) pairs describing the format."""
    fmt = get_format(fmt)
    return [
        ("bits", f"{fmt.nbits} ({'sign, ' if fmt.signed else 'no sign, '}{fmt.ebits} exponent, {fmt.mbits} mantissa)"),
        ("exponent bias", str(fmt.bias)),
        ("max finite", _value_str(fmt.max)),
        ("min normal", _value_str(fmt.min_normal)),
        ("min subnormal", _value_str(fmt.min_subnormal) if fmt.has_subnormals else "none (no subnormals)"),
        ("infinities", ", ".join(f"0x{c:02X}" for c in fmt.inf_codes) or "none"),
        ("NaN codes", ", ".join(f"0x{c:02X}" for c in fmt.nan_codes) or "none"),
        ("source", fmt.source),
    ]


def policies(fmt) -> list:
    """(policy, behaviour) pairs of :func:`fp4ref.encode`'s defaults for ``fmt``, each shown on a real input."""
    import numpy as np

    fmt = get_format(fmt)

    def enc(x, **kw):
        return f"0x{int(encode(np.float64(x), fmt, **kw)):02X}"

    rows = [("rounding", "RNE (ties to the even code) by default; also rna (ties away from zero), rz, ru, rd, "
                         "stochastic (floor = rd, ceil = ru)")]
    rows.append(("ties", tie_behaviour(fmt)))
    # an input past the largest code that float32 holds too (UE8M0's 4 x 2^127 would be inf as float32)
    big = min(fmt.max * 4, float(np.finfo(np.float32).max))
    if fmt.special == "none":
        rows.append(("overflow", f"always saturates: {big!r} -> {enc(big)}, +inf -> {enc(math.inf)}"))
        rows.append(("NaN input", f"raises ValueError by default; nan='max' -> {enc(math.nan, nan='max')}, "
                                  f"nan='zero' -> {enc(math.nan, nan='zero')}"))
    else:
        sat_default = fmt.special != "ue8m0"
        rows.append((
            "overflow",
            f"saturate={sat_default} by default. saturate=True: {big!r} -> {enc(big, saturate=True)}, "
            f"+inf -> {enc(math.inf, saturate=True)}; saturate=False: {big!r} -> {enc(big, saturate=False)}, "
            f"+inf -> {enc(math.inf, saturate=False)}",
        ))
        neg_nan = f", -NaN -> {enc(-math.nan)}" if fmt.signed else ""
        rows.append(("NaN input", f"kept: NaN -> {enc(math.nan)}{neg_nan}; also nan='raise'|'max'|'zero'"))
    if fmt.signed:
        rows.append(("-0.0", f"-0.0 -> {enc(-0.0)}; {-fmt.min_subnormal / 4!r} -> {enc(-fmt.min_subnormal / 4)}"))
    else:
        rows.append(("zero and sign", f"no zero: 0.0 -> {enc(0.0)} (2^-127); negative non-zero input raises"))
    if fmt.special == "none" and fmt is E2M1:
        rows.append(("E2M1 ties (RNE)", "to even: " + ", ".join(f"{t} -> {enc(t)}" for t in (0.25, 1.25, 2.5, 5.0))))
    if fmt.special == "ue8m0":
        rows.append(("other libraries", _UE8M0_LIBRARIES))
    return rows


#: What other libraries' UE8M0 casts do (tests/test_encode.py checks each claim against ml_dtypes and torch).
_UE8M0_LIBRARIES = (
    "ml_dtypes 0.7 `float8_e8m0fnu`: ties up (= rna: 3.0 -> 0x81, 0.75 -> 0x7F), 0 and negative values -> NaN "
    "(0xFF), 1.5 * 2^127 and above -> 0xFF. torch 2.13 `float8_e8m0fnu`: ties up (= rna) for normal inputs, the "
    "sign ignored (-2.0 -> 0x80), 0 -> 0x00, NaN and inf -> 0xFF, and every float32 subnormal in (2^-127, 2^-126) "
    "-> 0x01, so (2^-127, 1.5 * 2^-127), which rna and rne send to 0x00, gives 0x01. fp4ref rne gives the even "
    "byte at every tie (3.0 -> 0x80, 0.75 -> 0x7E)."
)


def _tie_points(fmt: FloatFormat) -> list:
    """The first two ties between neighbouring finite codes with values >= 1, the lower code even in the first and
    odd in the second: [(lo_code, hi_code, midpoint)]."""
    import numpy as np

    mag = (1 << (fmt.nbits - int(fmt.signed))) - 1
    vals = decode(np.arange(mag + 1, dtype=np.uint8), fmt, np.float64).tolist()
    found: dict = {}
    for c in range(mag):
        lo, hi = vals[c], vals[c + 1]
        if lo >= 1 and math.isfinite(hi) and hi > lo:
            found.setdefault(c % 2, (c, c + 1, (lo + hi) / 2))
    return [found[0], found[1]]


def tie_behaviour(fmt) -> str:
    """What every rounding mode of :func:`fp4ref.encode` does at two ties of ``fmt`` (lower code even, then odd),
    and at the negative of the first for signed formats, computed by encode."""
    import numpy as np

    fmt = get_format(fmt)
    width = (fmt.nbits + 3) // 4
    modes = ("rne", "rna", "rz", "ru", "rd")
    parts = []
    points = _tie_points(fmt)
    xs = [(p[2], p[0], p[1]) for p in points]
    if fmt.signed:
        xs.append((-points[0][2], points[0][0] | (1 << (fmt.nbits - 1)), points[0][1] | (1 << (fmt.nbits - 1))))
    for x, lo, hi in xs:
        codes = ", ".join(f"{m} 0x{int(encode(np.float64(x), fmt, rounding=m)):0{width}X}" for m in modes)
        parts.append(f"{x!r} (between 0x{lo:0{width}X} and 0x{hi:0{width}X}): {codes}")
    return "; ".join(parts) + "; stochastic: either neighbour, probability 1/2 each"


def formats_markdown(names=None) -> str:
    """Markdown document: for each format (all by default) its properties, encode policies and full code table."""
    fmts = [get_format(n) for n in (names or FORMATS)]
    out = [
        "# Element formats",
        "",
        "Generated by `fp4ref formats --markdown` from `fp4ref/formats.py`; do not edit by hand "
        "(a test compares this file with the command's output).",
        "",
    ]
    for fmt in fmts:
        out += [f"## {fmt.name.upper()}", "", "| property | value |", "|---|---|"]
        out += [f"| {k} | {v} |" for k, v in properties(fmt)]
        out += ["", "| encode policy | behaviour |", "|---|---|"]
        out += [f"| {k} | {v} |" for k, v in policies(fmt)]
        out += ["", "| code | bits | value | class |", "|---|---|---|---|"]
        out += [f"| {h} | {b} | {v} | {c} |" for h, b, v, c in code_rows(fmt)]
        out.append("")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------ NVFP4 recipes

#: Inputs on which NVFP4 recipes' bytes differ. Each is a float32 row [1, 32] given by bit patterns: block 0 holds
#: only the tensor amax A, block 1 the listed elements (its first is the block amax a), the rest zeros. Arithmetic
#: cases first (fewest non-zero elements first), policy cases last. tests/test_blockscale.py checks every recipe's
#: bytes on them against an exact-rational model of each source (tests/_nvfp4_sim.py).
NVFP4_CASES = (
    ("te vs sol: 272 tie", 0x430AD652, (0x42A89688,),
     "te: a * (S_enc * fp32(1/6)) = 272.00003 -> E4M3 288; sol: (a/6) * S_enc = 272.0, the tie between 256 and 288 "
     "-> 256"),
    ("te and exact vs rest", 0x427550F8, (0x416C8E13,), "te's scale product rounds below the tie"),
    ("exact vs rest", 0x42494B57, (0x4133BA20,), "every fp32 order lands past the exact quotient's side"),
    ("modelopt vs rest", 0x403F934F, (0x3DE8A098,), "a/(6*sf2) (one division) vs (a/6)/pts (two)"),
    ("global A/2688 vs 1/(2688/A)", 0x3EF8E674, (0x3E3AACD8,), "the stored global scales differ by an ulp"),
    ("element: exact vs rest", 0x3C123924, (0x3BEA6351, 0x39992FAC), "x just above an E2M1 tie in exact arithmetic"),
    ("element: reciprocal multiply vs division", 0x3C123924, (0x3BAA5F97, 0x395ED0FB),
     "x * (1/(s*S_dec)) and x * ((1/pts)/s) land on the tie, x / (pts*s) above it"),
    ("element: torchao 0.18 vs 0.16", 0x4303A307, (0x42D53715, 0x42AC61AE), "x * ((1/pts)/s) vs x / (pts*s)"),
    ("element: torchao single-level 0.18 vs 0.16", 0x42AD14AE, (0x42A5DF1B, 0x4243FFFF), "x * (1/s) vs x / s"),
    ("4over6: MAE vs MSE (e4m3_max 448)", 0x3DDC880B, (0x3C980267, 0xBC28F31F, 0xBB87F9A9, 0xBB85E932),
     "map-to-4 has the smaller sum of absolute errors, map-to-6 the smaller sum of squares"),
    ("4over6: MAE vs MSE (e4m3_max 256)", 0x3DDC880B, (0x3D30AA33, 0x3C426688, 0x3C9EA5FB, 0xBCCC9C40),
     "as above with the 256 global scale"),
    ("zero block (policy)", 0x40C00000, (), "scale floor: te/sol/exact 0, torchao 2^-6, modelopt 1.0"),
    ("-0.0 element (policy)", 0x40C00000, (0x40C00000, 0x80000000, 0xBDCCCCCD),
     "-0.0: te/sol/modelopt 0x0, torchao/exact 0x8; -0.1 rounds to 0x8 everywhere"),
    ("tiny amax: torchao 0.18's 1/pts = inf (policy)", 0x04800000, (0x04000000, 0x03000000, 0x00000000),
     "A = 2^-118, pts <= 2^-128: x * inf = +-6 for x != 0; 0 * inf = NaN in the source, fp4ref gives 0x0"),
)


def nvfp4_case_row(case) -> "np.ndarray":
    """The float32 [1, 32] input of one :data:`NVFP4_CASES` entry."""
    import numpy as np

    _, a_bits, block1, _ = case
    bits = [a_bits] + [0] * 15 + list(block1) + [0] * (16 - len(block1))
    return np.array(bits, dtype=np.uint32).view(np.float32)[None, :]


def nvfp4_case_bytes(case, recipe) -> tuple:
    """(block-0 scale byte, block-1 scale byte, codes of block 1's listed elements (at least two)) of a case."""
    from .blockscale import nvfp4_quantize
    from .packing import unpack_fp4

    t = nvfp4_quantize(nvfp4_case_row(case), recipe=recipe)
    n = max(2, len(case[2]))
    return int(t.scales[0, 0]), int(t.scales[0, 1]), tuple(int(c) for c in unpack_fp4(t.codes)[0, 16:16 + n])


def first_differences() -> dict:
    """{recipe: {other recipe: number (1-based) of the first :data:`NVFP4_CASES` entry on which their bytes differ,
    or None}} over every pair of :class:`fp4ref.blockscale.NVFP4Recipe` values."""
    from .blockscale import NVFP4_RECIPES

    names = [r.value for r in NVFP4_RECIPES]
    got = [{n: nvfp4_case_bytes(case, n) for n in names} for case in NVFP4_CASES]
    return {a: {b: next((i for i, g in enumerate(got, 1) if g[a] != g[b]), None) for b in names if b != a}
            for a in names}


def first_differences_line(recipe: str, table: dict | None = None) -> str:
    """The line each NVFP4Recipe docstring carries: the first case (docs/quantization.md) separating it from each
    other recipe."""
    row = (table or first_differences())[recipe]
    return "Smallest differing inputs (docs/quantization.md case #): " + ", ".join(
        f"{other} {n}" for other, n in row.items()) + "."


def recipes_markdown() -> str:
    """docs/quantization.md's generated part: the recipe table (from :data:`fp4ref.blockscale.NVFP4_RECIPES`), the
    difference cases with every recipe's bytes, and for each pair of recipes the first case that separates them."""
    from .blockscale import NVFP4_RECIPES

    names = [r.value for r in NVFP4_RECIPES]
    out = [
        "| recipe | reproduces | file | function | global decode scale | block scale byte `s` | element code | "
        "-0.0 | zero block |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rec, src in NVFP4_RECIPES.items():
        out.append(f"| `{rec.value}` | {src.library} | `{src.file}` | `{src.function}` | {src.global_scale} | "
                   f"{src.block_scale} | {src.element} | {src.negative_zero} | {src.zero_block} |")
    out += ["", "Inputs on which the recipes' bytes differ (float32 [1, 32]: block 0 holds only the tensor amax A, "
            "block 1 the listed elements, the first being its amax a, then zeros). Bytes: block-0 scale, block-1 "
            "scale / codes of block 1's listed elements; recipes with equal bytes are grouped.", "",
            "| # | case | A (bits) | block 1 (bits) | bytes: recipes | why |", "|---|---|---|---|---|---|"]
    results = []
    for i, case in enumerate(NVFP4_CASES, 1):
        got = {n: nvfp4_case_bytes(case, n) for n in names}
        results.append(got)
        groups: dict = {}
        for n in names:
            groups.setdefault(got[n], []).append(n)
        cell = "<br>".join(f"{s0},{s1} / {','.join(map(str, codes))}: {', '.join(g)}"
                           for (s0, s1, codes), g in groups.items())
        blk = ", ".join(f"0x{b:08X}" for b in case[2]) or "all zero"
        out.append(f"| {i} | {case[0]} | 0x{case[1]:08X} | {blk} | {cell} | {case[3]} |")
    out += ["", "First case (#) on which each pair of recipes differs:", "",
            "| | " + " | ".join(f"`{n}`" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for a in names:
        cells = []
        for b in names:
            first = next((i for i, got in enumerate(results, 1) if got[a] != got[b]), None)
            cells.append("" if a == b else (str(first) if first else "-"))
        out.append(f"| `{a}` | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    """``python -m fp4ref.tables``: print the generated part of docs/quantization.md (the recipes' table). It
    takes no options (argparse: ``--help`` prints this, anything else is a usage error, exit status 2)."""
    import argparse

    from ._validate import help_description

    argparse.ArgumentParser(prog="python -m fp4ref.tables", description=help_description(main.__doc__)).parse_args(argv)
    print(recipes_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
