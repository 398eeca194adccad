"""The generated documentation matches the code that generates it; docstrings have no broken lines."""
from pathlib import Path

import pytest

from fp4ref import tables

ROOT = Path(__file__).resolve().parent.parent


def test_formats_md_is_generated_output():
    committed = (ROOT / "docs" / "formats.md").read_text()
    generated = tables.formats_markdown() + "\n"
    assert committed == generated, "docs/formats.md is stale: run `fp4ref formats --markdown > docs/formats.md`"


def test_formats_md_shows_known_rows():
    # Hand-checked rows (OCP OFP8 / MX v1.0 tables): E2M1 0b1001 = -0.5, 0b1000 = -0; E4M3FN max 448 at 0x7E;
    # UE8M0 0 = 2^-127.
    text = (ROOT / "docs" / "formats.md").read_text()
    assert "| 0x9 | 1001 | -0.5 (= -2^-1) | subnormal |" in text
    assert "| 0x8 | 1000 | -0 | zero |" in text
    assert "| 0x7E | 01111110 | 448.0 | max |" in text
    assert "| 0x00 | 00000000 | 5.877471754111438e-39 (= 2^-127) | normal |" in text


def test_quantization_md_recipe_tables_are_generated_output():
    text = (ROOT / "docs" / "quantization.md").read_text()
    start, end = "<!-- generated: python -m fp4ref.tables -->\n", "\n<!-- end generated -->"
    assert text.count(start) == 1 and text.count(end) == 1
    committed = text[text.index(start) + len(start):text.index(end)]
    assert committed == tables.recipes_markdown(), (
        "docs/quantization.md's recipe tables are stale: replace the generated block with `python -m fp4ref.tables`"
    )


def test_tables_module_prints_the_block_and_takes_no_options(capsys):
    """``python -m fp4ref.tables`` printed the tables whatever its arguments (``--help``, ``--bogus``): now
    argparse's usage error (exit status 2) for an option, its help for --help, the table otherwise."""
    assert tables.main([]) == 0 and capsys.readouterr().out == tables.recipes_markdown() + "\n"
    for argv, code in ((["--bogus-flag"], 2), (["extra"], 2), (["--help"], 0)):
        with pytest.raises(SystemExit) as exc:
            tables.main(argv)
        out = capsys.readouterr()
        assert exc.value.code == code and "python -m fp4ref.tables" in out.out + out.err
        assert tables.recipes_markdown() not in out.out


def test_quantization_md_names_every_recipe_and_its_release():
    from fp4ref.blockscale import NVFP4_RECIPES

    text = (ROOT / "docs" / "quantization.md").read_text()
    for rec, src in NVFP4_RECIPES.items():
        assert f"| `{rec.value}` | {src.library} |" in text
    # hand-checked rows: torchao 0.18 multiplies by reciprocals, 0.16 divides; ModelOpt's zero-block scale 1.0
    assert "`e2m1(clamp(x * ((1/pts)/s), ±6))`" in text and "`e2m1(clamp(x / (pts * s), ±6))`" in text
    assert "| `modelopt` | ModelOpt 0.47.0 |" in text


def test_each_recipe_docstring_gives_its_source_and_smallest_differing_inputs():
    # attribute docstrings of NVFP4Recipe's members, read from the source (they are not runtime attributes)
    import ast

    from fp4ref.blockscale import NVFP4_RECIPES

    src = (ROOT / "fp4ref" / "blockscale.py").read_text()
    cls = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == "NVFP4Recipe")
    docs = {}
    for a, b in zip(cls.body, cls.body[1:]):
        if isinstance(a, ast.Assign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
            docs[a.value.value] = " ".join(b.value.value.split())
    table = tables.first_differences()
    assert set(docs) == {r.value for r in NVFP4_RECIPES}
    for rec in NVFP4_RECIPES:
        doc = docs[rec.value]
        assert tables.first_differences_line(rec.value, table) in doc, (
            f"NVFP4Recipe.{rec.name}'s docstring is stale: its 'Smallest differing inputs' line must read "
            f"{tables.first_differences_line(rec.value, table)!r}"
        )
    # the release each reproduces, in the docstring
    for name, release in (("te", "2.18"), ("torchao", "0.18.0"), ("torchao-0.16", "0.16"), ("modelopt", "0.47.0"),
                          ("te-4over6", "2.18")):
        assert release in docs[name], name


def test_no_docstring_line_is_a_word_broken_out_of_its_sentence():
    """A docstring line holding one lowercase word between two lines of the same paragraph (the next one starting
    in lowercase) is a bad line break (compress_2to4's "index" line was one)."""
    import ast
    import re

    hits = []
    for path in sorted((ROOT / "fp4ref").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = [ln.strip() for ln in (ast.get_docstring(node) or "").splitlines()]
            for prev, cur, nxt in zip(lines, lines[1:], lines[2:]):
                if re.fullmatch(r"[a-z][\w-]*", cur) and prev and nxt[:1].islower():
                    hits.append(f"{path.relative_to(ROOT)}: {getattr(node, 'name', '<module>')}: {cur!r}")
    assert not hits, hits
