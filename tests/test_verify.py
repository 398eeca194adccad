"""``fp4ref verify`` end to end: the project's kernel in the Triton CPU interpreter, and user kernels via --kernel."""
import json
import math

import pytest

from fp4ref import verify as V
from fp4ref.cli import main

torch = pytest.importorskip("torch")


def _run(tmp_path, *argv):
    path = tmp_path / "report.json"
    status = main(["verify", *argv, "--json", str(path)])
    return status, json.loads(path.read_text())


def test_project_gemm_kernel_passes_in_interpreter(tmp_path):
    status, rep = _run(tmp_path, "--workload", "gemm_n3072_k2048", "--device", "cpu", "--sizes", "3",
                       "--families", "exact_acc")
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
    with pytest.raises(ValueError, match="kernel="):
        V.load_kernel("no_colon")
    with pytest.raises(ValueError, match="workload="):
        V.verify(["not_a_workload"], device="cpu")
    with pytest.raises(ValueError, match="family="):
        V.verify(["gemm_n3072_k2048"], device="cpu", families=["bogus"], sizes=[1])
    with pytest.raises(SystemExit):
        main(["verify", "--kernel", "tests._verify_kernels:right"])  # --kernel without --workload


def test_definition_file_selects_workload(tmp_path):
    d = {"name": "gemm_n3072_k2048", "op_type": "gemm",
         "axes": {"M": {"type": "var"}, "N": {"type": "const", "value": 3072}, "K": {"type": "const", "value": 2048}},
         "inputs": {"A": {"shape": ["M", "K"], "dtype": "float16"}, "B": {"shape": ["N", "K"], "dtype": "float16"}},
         "outputs": {"C": {"shape": ["M", "N"], "dtype": "float16"}}}
    p = tmp_path / "def.json"
    p.write_text(json.dumps(d))
    assert V.workload_from_definition(str(p))[0] == "gemm_n3072_k2048"
    d["axes"]["N"]["value"] = 4096
    p.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="matches none"):
        V.workload_from_definition(str(p))


def test_kernel_with_wrong_output_shape_is_a_failing_row(tmp_path):
    status, rep = _run(tmp_path, "--workload", "gemm_n3072_k2048", "--kernel", "tests._verify_kernels:wrong_shape",
                       "--device", "cpu", "--sizes", "2", "--families", "public")
    (row,) = rep["rows"]
    assert status == 1 and not row["fp4ref_ok"] and "output rejected" in row["note"]
