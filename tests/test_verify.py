"""``fp4ref verify`` end to end: the project's kernel in the Triton CPU interpreter, and user kernels via --kernel."""
import json
import math
import os
import re

import numpy as np
import pytest

from fp4ref import verify as V
from fp4ref.bounds import DEFAULT_MODEL
from fp4ref.cli import main

torch = pytest.importorskip("torch")


def _run(tmp_path, *argv):
    """Run the CLI; the report with only its numeric rows (the integrity rows are under "integrity")."""
    path = tmp_path / "report.json"
    status = main(["verify", *argv, "--json", str(path)])
    rep = json.loads(path.read_text())
    rep["integrity"] = {r["family"].split(":", 1)[1]: r for r in rep["rows"] if r["kind"] == "integrity"}
    rep["rows"] = [r for r in rep["rows"] if r["kind"] == "numeric"]
    return status, rep


def test_project_gemm_kernel_passes_in_interpreter(tmp_path):
    status, rep = _run(tmp_path, "--workload", "gemm_n3072_k2048", "--device", "cpu", "--sizes", "3",
                       "--families", "exact_acc", "--no-integrity")  # the default run covers its integrity
    assert status == 0 and rep["ok"] is True, rep
    (row,) = rep["rows"]
    assert (row["workload"], row["m"], row["family"], row["checked_rows"]) == ("gemm_n3072_k2048", 3, "exact_acc", 3)
    # exact-accumulation inputs: every element equals the correctly rounded reference
    assert row["bitwise_equal_pct"] == 100.0 and row["max_ulps"] == 0
    assert row["fp4ref_ok"] and row["fib_ok"] and row["sol_ok"]
    assert 0 < row["max_err_over_bound"] <= 1 and math.isfinite(row["sqnr_db"])


def test_user_kernel_right_passes(tmp_path):
    status, rep = _run(tmp_path, "--workload", "gemm_n3072_k2048", "--kernel", "tests._verify_kernels:right",
                       "--device", "cpu", "--sizes", "2", "--families", "exact_acc")
    assert status == 0 and rep["rows"][0]["bitwise_equal_pct"] == 100.0


def test_json_records_what_was_asked_and_nulls_what_an_integrity_row_lacks(tmp_path):
    status, rep = _run(tmp_path, "--workload", "GEMM_N3072_K2048", "--kernel", "tests._verify_kernels:right",
                       "--device", "cpu", "--sizes", "2", "2", "--families", "EXACT_ACC", "--model",
                       "FP32_RN", "--output-rounding", "faithful")
    assert status == 0, rep
    s = rep["settings"]
    assert s["device"] == "cpu (TRITON_INTERPRET=1)" and s["gpu"] is None and s["fp4ref"]
    assert (s["workloads"], s["kernel"], s["sizes"], s["families"]) == (
        ["gemm_n3072_k2048"], "tests._verify_kernels:right", [2], ["exact_acc"])
    assert (s["model"], s["output_rounding"], s["integrity"]) == ("fp32_rn", "faithful", True)
    (row,) = rep["rows"]
    assert (row["model"], row["output_rounding"]) == ("fp32_rn", "faithful")
    assert set(rep["integrity"]) == set(V.INTEGRITY_CHECKS)
    for r in rep["integrity"].values():  # the table's "-" cells: null, not a verdict or "nan"
        assert all(r[f] is None for f in ("model", "output_rounding", "checked_rows", "max_err_over_bound",
                                          "max_ulps", "bitwise_equal_pct", "sqnr_db", "fib_ok", "sol_ok")), r
        assert r["fp4ref_ok"] is True and r["examples"] == 1
    default = V.verify(["gemm_n3072_k2048"], kernel="tests._verify_kernels:right", device="cpu", sizes=[1],
                       families=["public"], integrity=False).settings
    assert (default["sizes"], default["families"], default["model"], default["output_rounding"]) == (
        [1], ["public"], None, None)


@pytest.mark.parametrize("bug", ["truncating_store", "last_column_skipped"])
def test_user_kernel_bugs_fail_fp4ref_but_pass_public_checkers(tmp_path, bug):
    # Power test: the public checkers' loose tolerances pass both bugs; fp4ref's exact-accumulation check
    # demands the correctly rounded output and fails them.
    status, rep = _run(tmp_path, "--workload", "gemm_n3072_k2048", "--kernel", f"tests._verify_kernels:{bug}",
                       "--device", "cpu", "--sizes", "2", "--families", "exact_acc")
    (row,) = rep["rows"]
    assert status == 1 and rep["ok"] is False
    assert row["fp4ref_ok"] is False and row["bitwise_equal_pct"] < 100.0
    assert row["sol_ok"] is True  # within 0.005 + 0.02|r| for >= 99% of elements


def test_missing_kernel_is_a_failure_not_a_skip(tmp_path):
    status, rep = _run(tmp_path, "--workload", "gemm_n3072_k2048", "--kernel", "tests._verify_kernels:nope",
                       "--device", "cpu", "--sizes", "1")
    assert status == 1 and rep["ok"] is False and rep["rows"] == []
    assert rep["missing"][0][0] == "gemm_n3072_k2048" and "nope" in rep["missing"][0][1]


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"kernel \(--kernel\)="):
        V.load_kernel("no_colon")
    with pytest.raises(ValueError, match=r"workload \(--workload\)="):
        V.verify(["not_a_workload"], device="cpu")
    with pytest.raises(ValueError, match=r"family \(--families\)="):
        V.verify(["gemm_n3072_k2048"], device="cpu", families=["bogus"], sizes=[1])
    assert main(["verify", "--kernel", "tests._verify_kernels:right"]) == 2  # --kernel without --workload
    with pytest.raises(ValueError, match="sizes="):
        V.verify(["gemm_n3072_k2048"], device="cpu", sizes=[0])
    with pytest.raises(ValueError, match=r"seed \(--seed\)="):
        V.verify(["gemm_n3072_k2048"], device="cpu", sizes=[1], seed=-1)
    with pytest.raises(ValueError, match=r"max_check_rows \(--max-check-rows\)="):
        V.verify(["gemm_n3072_k2048"], device="cpu", sizes=[1], max_check_rows=5)
    with pytest.raises(ValueError, match="bogus"):
        V.verify(["gemm_n3072_k2048"], device="cpu", sizes=[1], model="bogus")
    assert main(["verify", "--workload", "gemm_n3072_k2048", "--sizes", "0"]) == 2
    assert main(["verify", "--workload", "gemm_n3072_k2048", "--json", "/no/such/dir/r.json"]) == 2
    assert main(["verify", "--workload", "gemm_n3072_k2048", "--json", "/"]) == 2  # a directory
    assert main(["verify", "--workload", "gemm_n3072_k2048", "--max-check-rows", "5"]) == 2


def test_usage_error_leaves_an_existing_json_report_alone(tmp_path):
    old = tmp_path / "old.json"
    old.write_text('{"previous": 1}')
    for bad in (["--sizes", "0"], ["--examples", "0"], ["--families", "bogus"]):
        assert main(["verify", "--workload", "gemm_n3072_k2048", "--json", str(old), *bad]) == 2
        assert old.read_text() == '{"previous": 1}'
    afile = tmp_path / "a_file"
    afile.write_text("x")
    assert main(["verify", "--workload", "gemm_n3072_k2048", "--repro", str(afile), "--sizes", "1"]) == 2
    earlier = tmp_path / "earlier_repro"
    earlier.mkdir()
    (earlier / "repro.py").write_text("# an earlier reproducer")
    assert main(["verify", "--workload", "gemm_n3072_k2048", "--repro", str(earlier), "--sizes", "1"]) == 2
    assert (earlier / "repro.py").read_text() == "# an earlier reproducer"  # not overwritten
    new = tmp_path / "new.json"
    assert main(["verify", "--workload", "gemm_n3072_k2048", "--json", str(new), "--sizes", "0"]) == 2
    assert not new.exists()  # the writability probe leaves no empty file behind
    assert main(["verify", "--workload", "gemm_n3072_k2048", "--kernel", "no_colon"]) == 2
    with pytest.raises(ValueError, match=r"their families are \['exact_acc', 'extreme', 'public'\]"):
        V.verify(["gemm_n3072_k2048"], device="cpu", sizes=[1], families=["nan_b"])


def test_definition_file_selects_workload(tmp_path):
    d = {"name": "gemm_n3072_k2048", "op_type": "gemm",
         "axes": {"M": {"type": "var"}, "N": {"type": "const", "value": 3072}, "K": {"type": "const", "value": 2048}},
         "inputs": {"A": {"shape": ["M", "K"], "dtype": "float16"}, "B": {"shape": ["N", "K"], "dtype": "float16"}},
         "outputs": {"C": {"shape": ["M", "N"], "dtype": "float16"}}}
    p = tmp_path / "def.json"
    p.write_text(json.dumps(d))
    assert V.workload_from_definition(str(p))[0] == "gemm_n3072_k2048"
    for broken in ({**d, "axes": {**d["axes"], "N": {"type": "const", "value": 4096}}},   # other N
                   {**d, "inputs": {"A": d["inputs"]["A"]}},                                 # an input missing
                   {**d, "inputs": {k: {**v, "dtype": "int8"} for k, v in d["inputs"].items()}}):  # other dtype
        p.write_text(json.dumps(broken))
        with pytest.raises(ValueError, match="matches none"):
            V.workload_from_definition(str(p))
    for malformed in ([1, 2], {"inputs": [], "axes": {}}, {"inputs": {"A": 1}, "axes": {}}):
        p.write_text(json.dumps(malformed))
        with pytest.raises(ValueError, match="expected an object"):
            V.workload_from_definition(str(p))


@pytest.mark.parametrize("bad, why", [("wrong_shape", "returned"), ("returns_none", "returned"),
                                      ("mutator", "modified its input"), ("exits", "SystemExit"),
                                      ("meta_output", "cannot be read")])
def test_misbehaving_kernels_are_failing_rows(tmp_path, bad, why):
    status, rep = _run(tmp_path, "--workload", "gemm_n3072_k2048", "--kernel", f"tests._verify_kernels:{bad}",
                       "--device", "cpu", "--sizes", "2", "--families", "public")
    (row,) = rep["rows"]
    assert status == 1 and rep["ok"] is False and not row["fp4ref_ok"] and why in row["note"]
    # no example completed: no metrics (strict JSON strings), never a vacuous 100% / inf
    assert row["examples"] == 0 and row["bitwise_equal_pct"] == "nan" and row["sqnr_db"] == "nan"


def test_notes_are_never_truncated_and_the_table_names_the_comparison_columns(tmp_path, capsys):
    status, rep = _run(tmp_path, "--workload", "gemm_n3072_k2048", "--kernel", "tests._verify_kernels:raises_long",
                       "--device", "cpu", "--sizes", "1", "--families", "public")
    (row,) = rep["rows"]
    assert status == 1 and row["note"] == "kernel raised RuntimeError: " + "x" * 300 + " END-OF-MESSAGE"
    lines = capsys.readouterr().out.splitlines()
    from fp4ref.cli import TABLE_CAPTION

    assert TABLE_CAPTION in lines  # one line, whole
    # not a terminal: one plain progress line per row (1 numeric + 6 integrity), counted and named
    progress = [ln for ln in lines if ln.startswith("[") and " s] gemm_n3072_k2048 M=1 " in ln]
    assert len(progress) == 7 and progress[0].startswith("[1/7 ") and progress[0].endswith(")")
    assert "public: FAIL" in progress[0] and "integrity:inputs_unchanged: not run" in progress[1]
    assert "FIB" in TABLE_CAPTION and "SOL" in TABLE_CAPTION and "comparison" in TABLE_CAPTION


@pytest.mark.parametrize("bad", ["raises_long", "returns_none"])
def test_integrity_rows_are_not_run_when_the_first_call_fails(tmp_path, capsys, bad):
    # no output to check: the integrity verdicts are "not run", not FAIL; the run still fails (exit 1)
    status, rep = _run(tmp_path, "--workload", "gemm_n3072_k2048", "--kernel", f"tests._verify_kernels:{bad}",
                       "--device", "cpu", "--sizes", "1", "--families", "public")
    assert status == 1 and rep["ok"] is False and set(rep["integrity"]) == set(V.INTEGRITY_CHECKS)
    assert rep["rows"][0]["not_run"] is False and rep["rows"][0]["fp4ref_ok"] is False
    assert all(r["not_run"] and not r["fp4ref_ok"] and r["note"].startswith("not run: ")
               for r in rep["integrity"].values())
    lines = capsys.readouterr().out.splitlines()
    table = [ln for ln in lines if ln.startswith("│ gemm_n3072_k2048 ")]
    assert len(table) == 7 and table[0].endswith(" FAIL │")  # the numeric row: the kernel's call failed
    assert all(ln.endswith(" not run │") for ln in table[1:]), table
    progress = [ln for ln in lines if " s] gemm_n3072_k2048 M=1 " in ln and "integrity:" in ln]
    assert len(progress) == 6 and all(": not run (" in ln for ln in progress), progress
    assert lines[-1] == "verification FAILED"


def test_table_keeps_whole_workload_and_family_names_on_a_narrow_terminal(monkeypatch, capsys):
    # an 80-column terminal: the long names fold over lines in their cells, never cut to "sp…"
    import rich.console

    class Narrow(rich.console.Console):
        def __init__(self, *a, **kw):
            super().__init__(*a, **{**kw, "width": 80})

        is_terminal = property(lambda self: True)

    monkeypatch.setattr(rich.console, "Console", Narrow)
    cells = _table_cells(monkeypatch, capsys)
    assert len(cells) > 2 and max(len("│".join(c)) for c in cells) <= 80
    assert "".join(c[1].strip() for c in cells) == "".join(w for w, _ in _LONG_NAMES)
    assert "".join(c[5].strip() for c in cells) == "".join(f for _, f in _LONG_NAMES)


def test_numbers_and_verdicts_are_never_cut_on_a_narrow_terminal(monkeypatch, capsys):
    """Wide numbers on an 80-column terminal: the padding goes, no data cell is cut to "…"; at 60 columns the
    rows run past the edge (the terminal wraps them) rather than losing a cell."""
    import rich.console

    row = V.Row(workload="sparse_gemm_fp4_fp8_n2048_k2048", m=8192, family="canonical", n=2048, k=2048,
                examples=12, checked_rows=8192, max_err_over_bound=0.0012345, max_ulps=1500.0,
                bitwise_equal_pct=99.99, sqnr_db=123.4, fib_ok=False, sol_ok=False, fp4ref_ok=False)
    res = V.VerifyResult(rows=[row], settings={"gpu": None, "device": "cpu", "examples": 12, "seed": 0})
    monkeypatch.setattr(V, "verify", lambda *a, **kw: res)
    for width in (80, 60):
        class Narrow(rich.console.Console):
            def __init__(self, *a, **kw):
                super().__init__(*a, **{**kw, "width": width})

            is_terminal = property(lambda self: True)

        monkeypatch.setattr(rich.console, "Console", Narrow)
        main([*GEMM, "--device", "cpu", "--sizes", "1"])
        out = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", capsys.readouterr().out)
        data = [ln.split("│") for ln in out.splitlines() if ln.count("│") == 15]
        first = [c.strip() for c in data[0]]
        assert first[2:5] == ["8192", "2048", "2048"] and first[6:12] == ["12", "8192", "0.00123", "1.5e+03",
                                                                          "99.99%", "123.4"], (width, first)
        assert first[12:15] == ["FAIL", "FAIL", "FAIL"], (width, first)
        table = [ln for ln in out.splitlines() if ln[:1] in "┏┃┡│└"]
        assert not any("…" in ln for ln in table), out  # no cell and no header cut short
        assert (max(len(ln) for ln in table) <= width) == (width == 80), out


_LONG_NAMES = [("sparse_gemm_fp4_fp8_n2048_k2048", "public"),
               ("nvfp4_linear_n8192_k8192", "integrity:fresh_inputs_same_buffers")]


def _table_cells(monkeypatch, capsys) -> list:
    """The verify table's data lines, split at the column rules, for rows with _LONG_NAMES."""
    rows = [V.Row(workload=w, m=1, family=f, n=128, k=2048, examples=1) for w, f in _LONG_NAMES]
    res = V.VerifyResult(rows=rows, settings={"gpu": None, "device": "cpu", "examples": 1, "seed": 0})
    monkeypatch.setattr(V, "verify", lambda *a, **kw: res)
    assert main([*GEMM, "--device", "cpu", "--sizes", "1"]) == 0
    out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # a terminal's colours
    return [ln.split("│") for ln in out.splitlines() if ln.count("│") == 15]


def test_table_piped_to_a_file_keeps_each_row_on_one_line(monkeypatch, capsys):
    # not a terminal (captured): the table is as wide as it needs, every name whole in one cell of one line
    cells = _table_cells(monkeypatch, capsys)
    assert [(c[1].strip(), c[5].strip()) for c in cells] == _LONG_NAMES


def test_failing_row_note_leads_with_the_failed_count(tmp_path):
    # truncating_store on exact_acc: the note starts with how many elements are not correctly rounded, counted
    # here independently from the same operands
    import numpy as np

    from fp4ref import gemm
    from fp4ref.workloads import get_workload
    from tests import _verify_kernels as K

    status, rep = _run(tmp_path, "--workload", "gemm_n3072_k2048", "--kernel", "tests._verify_kernels:truncating_store",
                       "--device", "cpu", "--sizes", "2", "--families", "exact_acc")
    (row,) = rep["rows"]
    w = get_workload("gemm_n3072_k2048")
    n, k = w.dims(True)
    rng = np.random.default_rng([0, 0, 2, sum(map(ord, w.name + "exact_acc"))])
    ops = w.families["exact_acc"](rng, 2, n, k)
    out = K.truncating_store(torch.from_numpy(ops["A"]), torch.from_numpy(ops["B"])).numpy()
    bad = int(np.sum(out != gemm.gemm_fp16(ops["A"], ops["B"]).out))
    assert 0 < bad < out.size
    assert row["note"].startswith(f"FAILED: {bad} / {out.size} (")
    assert "not equal to the correctly rounded output" in row["note"]
    # and names the bug from the error pattern
    assert row["diagnosis"] == ["rounded_toward_zero"] and "likely bug: rounded_toward_zero" in row["note"]


# ------------------------------------------------------------------------------------------- integrity verdicts

# planted bug -> the integrity verdicts it must fail (every other verdict of its run must pass, except for the
# aliased output: it is written into an input, so that input changes too)
INTEGRITY_BUGS = {
    "mutates_on_second_call": {"inputs_unchanged"},
    "aliases_input": {"output_not_aliased", "inputs_unchanged"},
    "pointer_cache": {"fresh_inputs_same_buffers"},
    "fingerprint_cache": {"fresh_inputs_same_buffers"},
    "nondeterministic": {"repeat_bitwise"},
    "reuses_output_buffer": {"mid_run_output_kept"},
    "subclass_output": {"plain_dense_output"},
}


def _integrity_run(name):
    res = V.verify(["gemm_n3072_k2048"], kernel=f"tests._verify_kernels:{name}", device="cpu", sizes=[2],
                   families=["public"])
    return res, {r.family.split(":", 1)[1]: r for r in res.rows if r.kind == "integrity"}


@pytest.mark.parametrize("name", list(INTEGRITY_BUGS))
def test_integrity_verdict_catches_its_planted_bug(name):
    from tests import _verify_kernels as K

    K._calls["n"] = 0
    K._cache.clear()
    res, integ = _integrity_run(name)
    assert set(integ) == set(V.INTEGRITY_CHECKS)
    failed = {c for c, r in integ.items() if not r.fp4ref_ok}
    must = INTEGRITY_BUGS[name]
    # an output written into B also corrupts later calls' inputs and itself changes: more verdicts may follow
    assert must <= failed if name == "aliases_input" else failed == must, {c: integ[c].note for c in failed}
    assert not res.ok and all(integ[c].note for c in failed)


@pytest.mark.parametrize("name", ["right", "noncontiguous_ok"])
def test_integrity_verdicts_pass_a_right_kernel(name):
    res, integ = _integrity_run(name)
    assert res.ok and len(integ) == len(V.INTEGRITY_CHECKS)
    assert all(r.fp4ref_ok and not r.note for r in integ.values()), {c: r.note for c, r in integ.items()}


def test_repro_shrinks_and_writes_a_script_that_fails_while_the_bug_is_there(tmp_path):
    import subprocess
    import sys

    from fp4ref.repro import load_operands

    d = tmp_path / "repro"
    umask = os.umask(0o027)  # the files follow the umask, as files open() creates do
    try:
        res = V.verify(["gemm_n3072_k2048"], kernel="tests._verify_kernels:truncating_store", device="cpu",
                       sizes=[7], families=["exact_acc"], integrity=False, repro=str(d))
    finally:
        os.umask(umask)
    assert not res.ok and "repro.py" in res.settings["repro"]
    assert {(d / f).stat().st_mode & 0o777 for f in ("repro.py", "inputs.npz")} == {0o640}
    ops = load_operands(str(d / "inputs.npz"))
    # shrunk: one row, and N, K from the sweep below the workload's
    w = V.get_workload("gemm_n3072_k2048")
    n, k = w.dims(True)
    assert ops["A"].shape[0] == 1 and ops["B"].shape[0] < n and ops["A"].shape[1] < k
    from fp4ref import gemm
    from tests import _verify_kernels as K

    out = K.truncating_store(torch.from_numpy(ops["A"]), torch.from_numpy(ops["B"])).numpy()
    assert np.any(out != gemm.gemm_fp16(ops["A"], ops["B"]).out)  # independently: the bug shows on them
    root = str(__import__("pathlib").Path(__file__).resolve().parent.parent)
    run = lambda: subprocess.run([sys.executable, str(d / "repro.py")], cwd=root, capture_output=True, text=True,
                                 timeout=300)
    p = run()
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Not equal to the correctly rounded output" in p.stdout
    script = (d / "repro.py").read_text().replace("tests._verify_kernels:truncating_store",
                                                   "tests._verify_kernels:right")
    (d / "repro.py").write_text(script)
    p = run()
    assert p.returncode == 0, p.stdout + p.stderr


def test_shapes_sweep_finds_a_k_tail_bug_that_fixed_shapes_miss():
    kw = dict(kernel="tests._verify_kernels:drops_k_tail", device="cpu", families=["public"], integrity=False)
    fixed = V.verify(["gemm_n3072_k2048"], sizes=[1], **kw)
    cpu_nk = V.get_workload("gemm_n3072_k2048").dims(True)
    assert fixed.ok and {(r.n, r.k) for r in fixed.rows} == {cpu_nk} and cpu_nk[1] % 64 == 0  # nothing to drop
    swept = V.verify(["gemm_n3072_k2048"], sizes=[1, 7], shapes="sweep", **kw)
    shapes = {(r.n, r.k) for r in swept.rows}
    assert shapes == set(V.sweep_shapes(V.get_workload("gemm_n3072_k2048")))
    assert any(k % 64 for _, k in shapes) and any(k < 64 for _, k in shapes) and any(n % 64 for n, _ in shapes)
    failed = [r for r in swept.rows if not r.fp4ref_ok]
    assert not swept.ok and {r.k for r in failed} == {k for _, k in shapes if k % 64}
    assert any("dropped_k_tail" in r.diagnosis for r in failed), [r.note for r in failed]
    with pytest.raises(SystemExit) as e:  # argparse: usage error, exit status 2
        main(["verify", "--workload", "gemm_n3072_k2048", "--shapes", "diagonal"])
    assert e.value.code == 2
    with pytest.raises(ValueError, match=r"shapes \(--shapes\)="):
        V.verify(["gemm_n3072_k2048"], device="cpu", shapes="diagonal")


def test_repro_keeps_only_the_k_block_that_shows_the_bug(tmp_path):
    from fp4ref.repro import load_operands

    d = tmp_path / "r"
    res = V.verify(["gemm_n3072_k2048"], kernel="tests._verify_kernels:wrong_fourth_k_block", device="cpu",
                   sizes=[2], families=["public"], integrity=False, repro=str(d))
    assert not res.ok and "1 of " in res.settings["repro"], res.settings["repro"]
    A = load_operands(str(d / "inputs.npz"))["A"]
    blocks = np.unique(np.flatnonzero(np.any(A != 0, axis=0)) // 64)
    assert blocks.tolist() == [3] and A.shape[0] == 1  # one row, one K-block: the one the bug reads wrong


def test_sparse_exact_acc_fails_an_unpromoted_fp8_kernel_end_to_end():
    # the miss: an fp8 accumulator never promoted to fp32 passed every verdict; now exact_acc fails it
    # (and names it), while the same accumulator promoted every 128 products passes
    kw = dict(device="cpu", sizes=[1], families=["exact_acc"], integrity=False)
    bad = V.verify(["sparse_gemm_fp4_fp8_n2048_k2048"], kernel="tests._verify_kernels:sparse_fp8_unpromoted", **kw)
    (row,) = bad.rows
    assert not bad.ok and row.bitwise_equal_pct < 90 and row.note.startswith("FAILED: ")
    # named first; here every wrong element is also the neighbour toward zero, which a truncating store gives too,
    # and with both explaining the whole output both are named
    assert row.diagnosis in (["unpromoted_fp8_accumulation"], ["unpromoted_fp8_accumulation", "rounded_toward_zero"]
                             ), row.note
    good = V.verify(["sparse_gemm_fp4_fp8_n2048_k2048"], kernel="tests._verify_kernels:sparse_fp8_promoted", **kw)
    assert good.ok and good.rows[0].bitwise_equal_pct == 100.0


GEMM = ["verify", "--workload", "gemm_n3072_k2048"]
RIGHT = [*GEMM, "--kernel", "tests._verify_kernels:right", "--device", "cpu", "--families", "exact_acc",
         "--no-integrity"]


def test_sizes_beyond_the_int32_limit_are_usage_errors_naming_sizes(capsys):
    """An M whose operands or output would reach 2**31 elements is refused before anything is allocated, with one
    line naming --sizes (not numpy's "Unable to allocate 76.3 GiB" traceback or "Maximum allowed dimension")."""
    assert V.max_m("gemm_n3072_k2048") == 699050 == (2**31 - 1) // 3072
    assert V.max_m("nvfp4_linear_n8192_k8192") == 262143
    limit = ("above 699050, the largest M for gemm_n3072_k2048 (M * max(N, K) must stay below 2**31 elements, the "
             "int32 offsets kernels index with)")
    for m in ("10000000", "99999999999999999999999", "699051"):
        assert main([*GEMM, "--sizes", "1", m]) == 2
        assert capsys.readouterr().err == f"fp4ref verify: error: --sizes {m}: {limit}\n"
    assert main(["verify", "--sizes", "300000"]) == 2  # every workload's limit applies (nvfp4: 262143)
    assert "--sizes 300000: above 262143, the largest M for nvfp4_linear_n8192_k8192" in capsys.readouterr().err
    assert main([*GEMM, "--sizes", "0", "-3"]) == 2
    assert capsys.readouterr().err.startswith("fp4ref verify: error: --sizes 0 -3: every M must be an int >= 1")
    with pytest.raises(ValueError, match=r"sizes=\[699051\]: M=699051 is above 699050"):
        V.verify(["gemm_n3072_k2048"], device="cpu", sizes=[699051])
    assert V.check_sizes(["gemm_n3072_k2048"], [7, 1, 7, 699050]) == [7, 1, 699050]


def test_out_of_memory_is_a_usage_error_naming_the_size(monkeypatch, capsys):
    """Operands that do not fit in this machine's memory (below the int32 limit): one line, exit 2."""
    def no_memory(case, seed, ex, max_check_rows):
        raise MemoryError("Unable to allocate 76.3 GiB for an array with shape (10000000, 1024) and data type "
                          "float64")

    monkeypatch.setattr(V, "_example", no_memory)
    assert main([*RIGHT, "--sizes", "3"]) == 2
    assert capsys.readouterr().err == (
        "fp4ref verify: error: --sizes: M=3 of gemm_n3072_k2048 (N=512, K=1024, family exact_acc) does not fit in "
        "memory (Unable to allocate 76.3 GiB for an array with shape (10000000, 1024) and data type float64); give "
        "a smaller M\n")


def test_repeated_sizes_and_families_count_once(tmp_path):
    status, rep = _run(tmp_path, *RIGHT[1:], "--sizes", "2", "1", "2", "--families", "exact_acc", "exact_acc",
                       "--workload", "gemm_n3072_k2048")
    assert status == 0 and [(r["m"], r["family"]) for r in rep["rows"]] == [(2, "exact_acc"), (1, "exact_acc")]
    assert V.plan_size(["gemm_n3072_k2048"] * 2, sizes=[1, 1, 2], families=["public", "public"],
                       integrity=False) == 2


def test_repeated_sizes_and_families_options_combine(tmp_path):
    """--sizes 1 --sizes 2 and --families exact_acc --families public combine, as --workload does (the last
    occurrence alone was kept)."""
    status, rep = _run(tmp_path, *RIGHT[1:], "--families", "public", "--sizes", "1", "--sizes", "2", "1")
    assert status == 0 and [(r["m"], r["family"]) for r in rep["rows"]] == [
        (1, "exact_acc"), (1, "public"), (2, "exact_acc"), (2, "public")]


def test_a_workload_without_the_families_asked_is_named_as_skipped(tmp_path, capsys):
    """--families nan_b runs the sparse workload only; the GEMM, which has no nan_b, is named in a note, in the
    final line and in the JSON report's "skipped" (it was skipped silently); a family no workload has: exit 2."""
    gemm, sparse = "gemm_n3072_k2048", "sparse_gemm_fp4_fp8_n2048_k2048"
    status, rep = _run(tmp_path, "--workload", gemm, "--workload", sparse, "--families", "nan_b", "--sizes", "1",
                       "--no-integrity", "--device", "cpu")
    out = capsys.readouterr().out
    assert status == 0 and [(r["workload"], r["family"]) for r in rep["rows"]] == [(sparse, "nan_b")]
    assert rep["skipped"] == [[gemm, "none of the families (--families) ['nan_b'] is one of its families "
                                     "['public', 'exact_acc', 'extreme']"]]
    assert f"{gemm}: skipped, not verified (none of the families (--families) ['nan_b']" in " ".join(out.split())
    assert "all verdicts pass (1 workload(s) skipped: see above)" in out
    assert main([*GEMM, "--workload", sparse, "--families", "bogus", "nan_b", "--sizes", "1"]) == 2
    assert "family (--families)='bogus' is not a family of" in capsys.readouterr().err


def test_existing_json_and_repro_outputs_need_force(tmp_path, capsys):
    """No output is replaced unasked: an existing --json file or reproducer is refused before the run (exit 2,
    the file unchanged); --force replaces them."""
    old = tmp_path / "old.json"
    old.write_text('{"previous": 1}')
    assert main([*RIGHT, "--sizes", "1", "--json", str(old)]) == 2
    assert capsys.readouterr().err == (f"fp4ref verify: error: --json {str(old)!r} already exists; pass --force to "
                                       "replace it\n")
    assert old.read_text() == '{"previous": 1}'
    assert main([*RIGHT, "--sizes", "1", "--json", str(old), "--force"]) == 0
    assert json.loads(old.read_text())["ok"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]  # no temporary file left beside it
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "inputs.npz").write_text("old inputs")
    bug = [*GEMM, "--kernel", "tests._verify_kernels:truncating_store", "--device", "cpu", "--sizes", "2",
           "--families", "exact_acc", "--no-integrity", "--repro", str(earlier)]
    assert main(bug) == 2
    assert capsys.readouterr().err == (f"fp4ref verify: error: --repro {earlier}: inputs.npz already there; pass "
                                       "--force to replace it, or give a new directory (it is created)\n")
    assert (earlier / "inputs.npz").read_text() == "old inputs"
    assert main([*bug, "--force"]) == 1
    assert sorted(p.name for p in earlier.iterdir()) == ["inputs.npz", "repro.py"]
    assert (earlier / "inputs.npz").read_bytes()[:2] == b"PK"  # the new reproducer's operands (a zip)


def test_repro_directory_is_checked_before_the_run(tmp_path, capsys, monkeypatch):
    import os

    ran = []
    monkeypatch.setattr(V, "verify", lambda *a, **k: ran.append(1))
    afile = tmp_path / "a_file"
    afile.write_text("x")
    assert main([*RIGHT, "--sizes", "1", "--repro", str(afile / "sub")]) == 2
    assert capsys.readouterr().err == (f"fp4ref verify: error: --repro {afile / 'sub'}: cannot create it ({afile} "
                                       "is not a directory)\n")
    assert main([*RIGHT, "--sizes", "1", "--repro", str(afile)]) == 2
    assert capsys.readouterr().err == f"fp4ref verify: error: --repro {afile}: not a directory\n"
    if os.geteuid() != 0:  # root writes into a read-only folder anyway
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            assert main([*RIGHT, "--sizes", "1", "--repro", str(ro)]) == 2
            assert capsys.readouterr().err == (f"fp4ref verify: error: --repro {ro}: cannot write in it (Permission "
                                               "denied)\n")
            assert main([*RIGHT, "--sizes", "1", "--repro", str(ro / "new" / "dir")]) == 2
            assert capsys.readouterr().err == (f"fp4ref verify: error: --repro {ro / 'new' / 'dir'}: cannot create "
                                               f"it in {ro} (Permission denied)\n")
        finally:
            ro.chmod(0o700)
    assert ran == [] and sorted(p.name for p in tmp_path.iterdir()) == ["a_file"] + (
        ["ro"] if os.geteuid() != 0 else [])


def test_ctrl_c_during_the_run_leaves_no_report(tmp_path):
    """A real SIGINT (Ctrl-C) while the rows run: exit 130, one line saying nothing was written, no traceback, no
    --json report and no --repro folder."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    report, rdir = tmp_path / "r.json", tmp_path / "repro"
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-m", "fp4ref.cli", *RIGHT, "--sizes", *map(str, range(1, 65)),
                             "--json", str(report), "--repro", str(rdir)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(root))
    line = proc.stdout.readline()  # the first plain progress line: the run has started
    assert line.startswith("[1/64 "), line + proc.stderr.read()
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal arrived")
    assert proc.returncode == 130, err
    assert err.splitlines() == ["fp4ref verify: interrupted; no --json report written; no --repro reproducer "
                                "written"], err
    assert list(tmp_path.iterdir()) == []


def test_sigterm_takes_the_ctrl_c_path_with_status_143(tmp_path, monkeypatch, capsys):
    import os
    import signal

    def killed(case, *args):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(V, "_run_case", killed)
    argv = [*GEMM, "--device", "cpu", "--sizes", "2", "--families", "exact_acc", "--no-integrity", "--json",
            str(tmp_path / "r.json")]
    assert main(argv) == 143
    assert capsys.readouterr().err == "fp4ref verify: terminated; no --json report written\n"
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored


def test_ctrl_c_says_what_was_written(tmp_path, monkeypatch, capsys):
    """An interrupt after the reproducer was written keeps it (complete) and says so; an interrupt while it is
    written leaves neither file, nor the folder it created."""
    import os

    d = tmp_path / "repro"
    real = V._run_case

    def then_ctrl_c(case, *args):
        rows = real(case, *args)
        raise KeyboardInterrupt

    monkeypatch.setattr(V, "_run_case", then_ctrl_c)
    bug = [*GEMM, "--kernel", "tests._verify_kernels:truncating_store", "--device", "cpu", "--sizes", "2",
           "--families", "exact_acc", "--no-integrity", "--json", str(tmp_path / "r.json")]
    assert main([*bug, "--repro", str(d)]) == 130
    assert capsys.readouterr().err == (f"fp4ref verify: interrupted; no --json report written; the reproducer in {d} "
                                       "is complete\n")
    assert sorted(p.name for p in d.iterdir()) == ["inputs.npz", "repro.py"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repro"]
    monkeypatch.setattr(V, "_run_case", real)
    replace, calls = os.replace, []

    def second_replace_interrupted(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt
        replace(src, dst)

    monkeypatch.setattr(os, "replace", second_replace_interrupted)
    d2 = tmp_path / "new" / "repro2"
    (tmp_path / "new").mkdir()
    assert main([*bug, "--repro", str(d2)]) == 130
    assert capsys.readouterr().err.endswith("no --json report written; no --repro reproducer written\n")
    assert [os.path.basename(c) for c in calls] == ["inputs.npz", "repro.py"]
    assert list((tmp_path / "new").iterdir()) == []


def test_a_kernels_plain_numeric_model_is_the_model_its_rows_are_checked_under(tmp_path, monkeypatch):
    """NUMERIC_MODEL = "<name>" (the short form docs/bounds.md names) sets the model, as NUMERIC_CONTRACT does; it
    was ignored and the looser default bound applied. A declaration of the wrong type or an unknown model is an
    error, not a silent default."""
    kernel = ("import torch\n{decl}\n"
              "def gemm(A, B):\n"
              "    return (A.double() @ B.double().T).to(torch.float16)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    kw = dict(device="cpu", sizes=[2], families=["public"], integrity=False)
    for i, (decl, want) in enumerate([('NUMERIC_MODEL = "fp32_rn"', "fp32_rn"), ("", DEFAULT_MODEL),
                                      ('NUMERIC_MODEL = "fp32_rn"\nNUMERIC_CONTRACT = {"accumulation_model": '
                                       '"exact"}', "exact")]):
        (tmp_path / f"plain_model_{i}.py").write_text(kernel.format(decl=decl))
        res = V.verify(["gemm_n3072_k2048"], kernel=f"plain_model_{i}:gemm", **kw)
        assert res.rows and {r.model for r in res.rows} == {want}, (decl, {r.model for r in res.rows})
    for i, (decl, exc, msg) in enumerate([('NUMERIC_MODEL = 3', TypeError, r"NUMERIC_MODEL=3: expected a model name"),
                                          ('NUMERIC_MODEL = "fp32"', ValueError, "not a known accumulation model"),
                                          ('NUMERIC_CONTRACT = "fp32_rn"', TypeError, "NUMERIC_CONTRACT: expected"),
                                          # a misspelled key was kept as a note: the loosest model, silently
                                          ('NUMERIC_CONTRACT = {"accumulation_modle": "exact"}', ValueError,
                                           r"bad_model_3.NUMERIC_CONTRACT: unknown key\(s\) 'accumulation_modle'; "
                                           r"the known keys are \['accumulation_model', ")]):
        (tmp_path / f"bad_model_{i}.py").write_text(kernel.format(decl=decl))
        with pytest.raises(exc, match=msg):
            V.verify(["gemm_n3072_k2048"], kernel=f"bad_model_{i}:gemm", **kw)


def test_a_model_with_no_finite_bound_at_the_workloads_K_is_refused_before_any_kernel_runs(tmp_path, monkeypatch):
    """hopper_fp8_wgmma gives no useful bound from K = 3971, where its eps_acc(K) reaches 1 (docs/bounds.md): at
    K = 8192 every row would have been checked against an infinite bound, and at K = 4096 against one that an
    all-zero output meets. verify refuses the model up front, declared or given with --model, and names
    the workload, K and the model; the kernel is never called."""
    import dataclasses

    from fp4ref.workloads import WORKLOADS

    monkeypatch.setattr(V, "get_workload", lambda n: dataclasses.replace(WORKLOADS[n], cpu_k=8192))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "vacuous_kernel.py").write_text(
        'NUMERIC_MODEL = "hopper_fp8_wgmma"\nCALLS = []\n'
        "def gemm(A, B):\n    CALLS.append(1)\n    raise AssertionError('called')\n")
    import vacuous_kernel

    kw = dict(device="cpu", sizes=[2], families=["public"], integrity=False)
    with pytest.raises(ValueError, match=r"gemm_n3072_k2048 at K=8192: the model vacuous_kernel:gemm declares for "
                                         r"M=2, N=512: model 'hopper_fp8_wgmma' gives no useful bound at K=8192: "
                                         r".* K >= 3971,"):
        V.verify(["gemm_n3072_k2048"], kernel="vacuous_kernel:gemm", **kw)
    with pytest.raises(ValueError, match=r"at K=8192: model \(--model\): model 'splitk\(hopper_fp8_wgmma, 8192\)'"):
        V.verify(["gemm_n3072_k2048"], kernel="tests._verify_kernels:right", model="splitk(hopper_fp8_wgmma, 8192)",
                 **kw)
    # K = 4096: eps_acc = t / (1 - t) with t = (4096 + 128) 2^-13 = 33/64, i.e. 33/31 >= 1 (finite, still refused)
    monkeypatch.setattr(V, "get_workload", lambda n: dataclasses.replace(WORKLOADS[n], cpu_k=4096))
    with pytest.raises(ValueError, match=r"gemm_n3072_k2048 at K=4096: the model vacuous_kernel:gemm declares for "
                                         r"M=2, N=512: model 'hopper_fp8_wgmma' gives no useful bound at K=4096: "
                                         r".* K >= 3971, .*all-zero output would pass"):
        V.verify(["gemm_n3072_k2048"], kernel="vacuous_kernel:gemm", **kw)
    assert vacuous_kernel.CALLS == []


def test_json_dash_sends_a_kernels_own_prints_to_stderr(tmp_path, monkeypatch, capsys):
    """--json -: a --kernel that prints (in its module and in every call) leaves stdout to the JSON alone; its text
    goes to stderr, and sys.stdout is restored after the run, also when the run stops with an exception."""
    import sys

    (tmp_path / "noisy_kernel.py").write_text(
        "import torch\n"
        "print('noisy module imported')\n"
        "def noisy(A, B):\n"
        "    print('noisy kernel called')\n"
        "    return (A.double() @ B.double().T).to(torch.float16)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "noisy_kernel", raising=False)
    argv = [*GEMM, "--kernel", "noisy_kernel:noisy", "--device", "cpu", "--sizes", "1", "--families", "exact_acc"]
    stdout = sys.stdout
    assert main([*argv, "--json", "-"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["ok"] is True  # nothing but the report
    assert "noisy module imported" in err and "noisy kernel called" in err, err
    assert sys.stdout is stdout
    assert main([*argv, "--json", str(tmp_path / "r.json")]) == 0  # a report file: the prints stay on stdout
    assert "noisy kernel called" in capsys.readouterr().out

    def interrupted(*a, **k):
        print("printed before the Ctrl-C")
        raise KeyboardInterrupt

    monkeypatch.setattr(V, "verify", interrupted)
    assert main([*argv, "--json", "-"]) == 130
    out, err = capsys.readouterr()
    assert out == "" and "printed before the Ctrl-C" in err
    assert sys.stdout is stdout


@pytest.mark.parametrize("argv", [["--json", ""], ["--repro", ""]])
def test_an_empty_report_path_is_an_error_not_no_report(argv, capsys):
    with pytest.raises(SystemExit) as ex:
        main([*GEMM, "--device", "cpu", "--sizes", "1", *argv])
    assert ex.value.code == 2
    assert f"{argv[0]}: empty path" in capsys.readouterr().err


def test_json_dash_writes_the_report_to_stdout_and_repro_dash_is_refused(tmp_path, monkeypatch, capsys):
    """--json - is standard output, as in fp4ref audit: stdout holds the JSON alone (the plain progress lines, the
    table and the notes go to stderr) and no file named "-" appears; --repro - is a usage error (two files)."""
    monkeypatch.chdir(tmp_path)
    assert main([*RIGHT, "--sizes", "1", "--json", "-"]) == 0
    out, err = capsys.readouterr()
    rep = json.loads(out)  # nothing but the report
    assert rep["ok"] is True and [(r["m"], r["family"]) for r in rep["rows"]] == [(1, "exact_acc")]
    assert "[1/1 " in err and "fp4ref verify on cpu" in err and "all verdicts pass" in err, err
    assert list(tmp_path.iterdir()) == []
    ran = []
    monkeypatch.setattr(V, "verify", lambda *a, **k: ran.append(1))
    assert main([*RIGHT, "--sizes", "1", "--repro", "-"]) == 2
    assert capsys.readouterr().err == ("fp4ref verify: error: --repro '-': the reproducer is two files (repro.py and "
                                       "inputs.npz), written in a directory, not to standard output; give a "
                                       "directory (./- for one named '-')\n")
    assert ran == [] and list(tmp_path.iterdir()) == []
    with pytest.raises(SystemExit):
        main(["verify", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "write the full report as JSON to PATH ('-' for stdout, which then holds the JSON alone: the progress, " \
           "the table, the notes and the kernels' own prints during the run go to stderr; an existing file only " \
           "with --force)" \
           in help_text
    assert "'-' is refused (two files go in a directory, not to stdout)" in help_text


@pytest.mark.parametrize("argv", [
    ["verify", "--json", "a.json", "--json", "b.json"],
    ["verify", "--repro", "r1", "--repro", "r2"],
    ["verify", "--workload", "gemm_n3072_k2048", "--kernel", "m:f", "--kernel", "m:g"],
    ["audit", "ckpt", "--json", "a.json", "--json", "b.json"],
    ["audit", "ckpt", "--reference", "orig1", "--reference", "orig2"],
    ["quantize", "in.safetensors", "-o", "a.safetensors", "--output", "b.safetensors"],
    # every other option that takes one value (the last one silently won: --include a --include b quantized b only)
    ["quantize", "in.safetensors", "-o", "o.safetensors", "--include", "layer", "--include", "bf"],
    ["quantize", "in.safetensors", "-o", "o.safetensors", "--format", "nvfp4", "--format", "mxfp4"],
    ["quantize", "in.safetensors", "-o", "o.safetensors", "--recipe", "te", "--recipe", "sol"],
    ["quantize", "in.safetensors", "-o", "o.safetensors", "--format", "mxfp4", "--mode", "floor", "--mode", "ceil"],
    ["quantize", "in.safetensors", "-o", "o.safetensors", "--jobs", "1", "--jobs", "2"],
    ["quantize", "in.safetensors", "-o", "o", "--dequantize", "--dtype", "float32", "--dtype", "float16"],
    ["quantize", "in", "-o", "o", "--checkpoint-format", "modelopt", "--checkpoint-format", "fp4ref"],
    ["audit", "ckpt", "--recipe", "te", "--recipe", "sol"],
    ["audit", "ckpt", "--mode", "floor", "--mode", "ceil"],
    ["verify", "--examples", "1", "--examples", "2"],
    ["verify", "--seed", "1", "--seed", "2"],
    ["verify", "--device", "cpu", "--device", "cuda"],
    ["verify", "--model", "fp32_rn", "--model", "exact"],
    ["verify", "--output-rounding", "rne", "--output-rounding", "faithful"],
    ["verify", "--max-check-rows", "0", "--max-check-rows", "256"],
    ["verify", "--shapes", "fixed", "--shapes", "sweep"],
])
def test_an_option_taking_one_value_given_twice_is_a_usage_error(argv, capsys, tmp_path, monkeypatch):
    """The last of two --json (or -o, --reference, --kernel, --include, --format, --seed, ...) silently won: a
    report asked for was not written, a tensor asked for not quantized. Now exit status 2 naming both values,
    before any work (nothing is created)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert re.search(r"(--[a-z-]+|-o) given twice \(\S+ and \S+\): give it once", err), err
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------------------
# From a mutation audit of verify.py / repro.py: behaviours no test above pins
# ---------------------------------------------------------------------------------------------------------------
GEMM_W, SPARSE_W = "gemm_n3072_k2048", "sparse_gemm_fp4_fp8_n2048_k2048"


def test_a_result_with_no_rows_is_not_ok():
    """Nothing verified is no pass: no rows, or only skipped workloads, is ok=False."""
    assert V.VerifyResult().ok is False
    r = V.VerifyResult(skipped=[[GEMM_W, "why"]])
    assert r.ok is False and r.to_json()["ok"] is False


def test_the_fib_column_divides_by_the_reference():
    """out 1.07421875 against the exact 1.0634765625 (both fp16): |d| = 0.0107421875 > 0.01 and d / |ref| =
    0.010101 > 0.01, so FlashInfer-Bench's rule fails it (d / |out| = 0.0099999 would pass); SOL passes it."""
    from fp4ref import gemm

    ref = gemm.gemm_fp16(np.array([[1.0634765625]], np.float16), np.array([[1.0]], np.float16))
    _, fib, sol, nrows = V._check_one(np.array([[1.07421875]], np.float16), ref, None, 1, DEFAULT_MODEL, "rne")
    assert (fib, sol, nrows) == (False, True, 1)


def test_examples_keep_the_worst_metrics_and_any_failure(tmp_path, monkeypatch):
    """A kernel wrong on its first call only, run with examples=2: the row fails (a passing second example does not
    clear it) and reports the worse example's ulps and bitwise share."""
    (tmp_path / "first_call_wrong.py").write_text(
        "from tests._verify_kernels import right, truncating_store\nCALLS = [0]\n"
        "def gemm(A, B):\n    CALLS[0] += 1\n    return truncating_store(A, B) if CALLS[0] == 1 else right(A, B)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    res = V.verify([GEMM_W], kernel="first_call_wrong:gemm", device="cpu", sizes=[2], families=["exact_acc"],
                   examples=2, integrity=False)
    (row,) = res.rows
    assert row.examples == 2 and not row.fp4ref_ok and not res.ok
    assert row.max_ulps == 1.0 and row.bitwise_equal_pct < 100.0  # truncation: one ulp, on the first example


def test_json_keeps_the_sign_of_an_infinite_metric():
    row = V.Row(workload="w", m=1, family="f", sqnr_db=-math.inf, max_err_over_bound=math.inf)
    j = V.VerifyResult(rows=[row]).to_json()
    assert j["rows"][0]["sqnr_db"] == "-inf" and j["rows"][0]["max_err_over_bound"] == "inf"
    json.dumps(j, allow_nan=False)


def test_a_definition_of_another_k_matches_no_workload(tmp_path):
    d = {"name": "g", "axes": {"M": {"type": "var"}, "N": {"type": "const", "value": 3072},
                               "K": {"type": "const", "value": 4096}},
         "inputs": {"A": {"dtype": "float16"}, "B": {"dtype": "float16"}}}
    p = tmp_path / "def.json"
    p.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="matches none"):
        V.workload_from_definition(str(p))


def test_ctrl_c_before_the_run_is_one_line_and_status_130(monkeypatch, capsys):
    # e.g. while check_dependencies imports torch: outside verify's own handler, still no traceback
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(V, "check_dependencies", interrupted)
    assert main(["verify", "--device", "cpu", "--sizes", "1"]) == 130
    assert capsys.readouterr().err == "fp4ref verify: interrupted\n"


def test_max_check_rows_must_leave_middle_rows():
    with pytest.raises(ValueError, match=r"max_check_rows \(--max-check-rows\)=128"):
        V.verify([GEMM_W], device="cpu", sizes=[1], max_check_rows=128)


def test_integrity_rows_run_once_per_workload_and_plan_size_counts_the_rows():
    """Integrity checks run at the first size only; plan_size (the progress bar's total) equals the rows made,
    also where a workload none of whose families is asked for is skipped (its integrity rows were counted)."""
    kw = dict(device="cpu", sizes=[1, 2], families=["public"])
    res = V.verify([GEMM_W], kernel="tests._verify_kernels:right", **kw)
    integ = [r for r in res.rows if r.kind == "integrity"]
    assert len(integ) == len(V.INTEGRITY_CHECKS) and {r.m for r in integ} == {1}
    assert len(res.rows) == 2 + len(V.INTEGRITY_CHECKS) == V.plan_size([GEMM_W], **kw)
    assert V.plan_size([GEMM_W, SPARSE_W], device="cpu", sizes=[1], families=["nan_b"]) == 1 + len(V.INTEGRITY_CHECKS)


def test_large_m_checks_the_sampled_rows_against_their_reference():
    res = V.verify([GEMM_W], kernel="tests._verify_kernels:right", device="cpu", sizes=[300], families=["exact_acc"],
                   integrity=False, max_check_rows=129)
    (row,) = res.rows
    assert res.ok and row.checked_rows == 129 and row.bitwise_equal_pct == 100.0


def test_sparse_repro_k_blocks_are_64_wide():
    """A sparse reproducer's K-blocks are 16 groups of 4 (64 K, 16 a_vals bytes): keeping block 3 of K = 2048
    leaves non-zero a_vals only in byte columns 48 .. 63."""
    from fp4ref import repro
    from fp4ref.workloads import WORKLOADS

    w = WORKLOADS[SPARSE_W]
    case = V._Case(w, None, "m:f", DEFAULT_MODEL, "rne", 1, 128, 2048, "public", False)
    assert repro._n_blocks(case) == 2048 // 64
    ops = w.families["public"](np.random.default_rng(0), 1, 128, 2048)
    keep = np.zeros(32, bool)
    keep[3] = True
    nz = np.flatnonzero(np.any(repro._zero_blocks(case, ops, keep)["a_vals"] != 0, axis=0))
    assert nz.size and nz.min() >= 48 and nz.max() < 64


def test_reproducer_operands_round_trip_bit_for_bit(tmp_path):
    """bf16 (with -0 and NaN) and E4M3FN bytes (NaN 0x7F, -0 0x80) and a float come back with their dtypes and bits."""
    import ml_dtypes

    from fp4ref.repro import load_operands, save_operands

    x = np.array([1.0, -0.0, np.nan], np.float32).astype(ml_dtypes.bfloat16)
    b = np.array([0x7F, 0x80, 0x01], np.uint8).view(ml_dtypes.float8_e4m3fn)
    save_operands(str(tmp_path / "o.npz"), {"x": x, "b": b, "s": 0.5})
    got = load_operands(str(tmp_path / "o.npz"))
    assert got["x"].dtype == ml_dtypes.bfloat16 and got["b"].dtype == ml_dtypes.float8_e4m3fn
    assert got["x"].view(np.uint16).tolist() == x.view(np.uint16).tolist()
    assert got["b"].view(np.uint8).tolist() == [0x7F, 0x80, 0x01] and got["s"] == 0.5
