"""bench_reference's command line: a usage error, not a traceback, for a repeat count that times nothing."""
from __future__ import annotations

import pytest

from fp4ref import bench_reference


@pytest.mark.parametrize("repeat", ["0", "-3"])
def test_repeat_below_one_is_a_usage_error(repeat):
    with pytest.raises(SystemExit) as exc:
        bench_reference.main(["--repeat", repeat])
    assert exc.value.code == 2
