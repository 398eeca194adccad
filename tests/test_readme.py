"""The README's examples run as written, and its set-up commands are the ones CI uses."""
import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PY_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_property_test_example_runs():
    (block,) = [b for b in PY_BLOCKS if "def test_" in b]
    ns: dict = {}
    exec(compile(block, "<README.md example>", "exec"), ns)  # not a file: nothing reads README lines as source
    tests = [v for k, v in ns.items() if k.startswith("test_")]
    assert len(tests) == 1
    tests[0]()  # Hypothesis runs the CI profile's examples through the interpreted kernel


def test_encode_example_output():
    (block,) = [b for b in PY_BLOCKS if "fp4ref.encode" in b]
    ns: dict = {}
    expr = [ln for ln in block.splitlines() if ln.startswith("fp4ref.encode")][0].split("#")[0]
    exec(block.splitlines()[0], ns)
    got = eval(expr, ns)
    # Hand-derived: ties 0.25 -> 0, 1.25 -> 1 (0x2), 2.5 -> 2 (0x4), 5 -> 4 (0x6);
    # -0.0 -> 0x8; 7 saturates to 6 (0x7).
    assert got.tolist() == [0x0, 0x2, 0x4, 0x6, 0x8, 0x7]
    assert "# -> array([0, 2, 4, 6, 8, 7], dtype=uint8)" in block


def test_setup_commands_match_ci():
    cmds = re.findall(r"```sh\n(python3 -m venv .*?)\n```", README)
    assert len(cmds) == 2 and cmds[0].endswith("fp4ref verify") and cmds[1].endswith("pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert cmds[1].split(" && ", 2)[2] in ci  # the README's install-and-test command, verbatim
