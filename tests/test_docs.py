"""The generated documentation matches the code that generates it."""
from pathlib import Path

from fp4ref import tables

ROOT = Path(__file__).resolve().parent.parent


def test_formats_md_is_generated_output():
    committed = (ROOT / "docs" / "formats.md").read_text()
    generated = tables.formats_markdown() + "\n"
    assert committed == generated, "docs/formats.md is stale: run `fp4ref formats --markdown > docs/formats.md`"


def test_formats_md_shows_known_rows():
    # Hand-checked rows (OCP OFP8 / MX v1.0 tables): E2M1 0b1001 = -0.5, 0b1000 = -0; E4M3FN max 448 at 0x7E; UE8M0 0 = 2^-127.
    text = (ROOT / "docs" / "formats.md").read_text()
    assert "| 0x9 | 1001 | -0.5 (= -2^-1) | subnormal |" in text
    assert "| 0x8 | 1000 | -0 | zero |" in text
    assert "| 0x7E | 01111110 | 448.0 | max |" in text
    assert "| 0x00 | 00000000 | 5.877471754111438e-39 (= 2^-127) | normal |" in text
