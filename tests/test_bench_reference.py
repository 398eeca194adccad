"""The CPU benchmark modules' command lines: usage errors (exit 2), not tracebacks, for arguments that time nothing
or that numpy would reject deep inside the run."""
from __future__ import annotations

import pytest

from fp4ref.bench import codecs as bench_codecs, quantize as bench_quantize, reference as bench_reference


@pytest.mark.parametrize("repeat", ["0", "-3"])
def test_repeat_below_one_is_a_usage_error(repeat):
    with pytest.raises(SystemExit) as exc:
        bench_reference.main(["--repeat", repeat])
    assert exc.value.code == 2


@pytest.mark.parametrize("module", [bench_codecs, bench_quantize, bench_reference], ids=lambda m: m.__name__)
def test_negative_seed_is_a_usage_error(module, capsys):
    with pytest.raises(SystemExit) as exc:
        module.main(["--seed", "-1", "--repeat", "1"])
    assert exc.value.code == 2
    assert "--seed -1" in capsys.readouterr().err
