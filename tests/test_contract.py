"""fp4ref.bounds.NumericContract: validation, model_for per config, the dict form user kernels may declare."""
import numpy as np
import pytest

from fp4ref import bounds, gemm
from fp4ref.bounds import NumericContract


def _by_config(config, K, interpreter, **launch):
    if interpreter:
        return "fp32_rn"
    return f"splitk(hopper_fp16_wgmma, {K // config})" if config > 1 else "hopper_fp16_wgmma"


def test_model_for_uses_the_config_model_and_the_contract_model_without_a_config():
    c = NumericContract(inputs="float16", output="float16", model="tc_fp32_universal", config_model=_by_config,
                        pick_config=lambda M, N, K, interp: 1 if M > 64 else 4)
    assert c.model_for(None, 2048).name == "tc_fp32_universal"
    assert c.model_for(None, 2048, interpreter=True).name == "fp32_rn"
    assert c.model_for(4, 2048).name == "splitk(hopper_fp16_wgmma, 512)"
    assert c.model_for(1, 2048).name == "hopper_fp16_wgmma"
    assert c.config_for(16, 3072, 2048) == 4 and c.config_for(128, 3072, 2048) == 1
    # the per-config model is tighter than the contract's promise, which must bound it
    assert c.model_for(4, 2048).eps(2048) < c.model_for(None, 2048).eps(2048)
    assert c.rounding_for(False) == "rne" and c.rounding_for(True) == "rne"


@pytest.mark.parametrize("kw, err", [
    (dict(model="no_such_model"), ValueError),
    (dict(model_interpreter="nope"), ValueError),
    (dict(output_rounding="rz"), ValueError),
    (dict(output="float32"), ValueError),
    (dict(epilogue_multiplies=17), ValueError),
    (dict(epilogue_multiplies=-1), ValueError),
    (dict(epilogue_multiplies=True), TypeError),
    (dict(epilogue_multiplies=2.0), TypeError),
    (dict(epilogue_multiplies="2"), TypeError),
    (dict(config_model="hopper_fp16_wgmma"), TypeError),
])
def test_contract_refuses_bad_fields(kw, err):
    base = dict(inputs="float16", output="float16", model="hopper_fp16_wgmma")
    with pytest.raises(err):
        NumericContract(**{**base, **kw})


def test_contract_takes_numpy_integer_epilogue_multiplies_as_an_int():
    c = NumericContract(inputs="x", output="bfloat16", model="fp32_rn", epilogue_multiplies=np.int64(2))
    assert c.epilogue_multiplies == 2 and type(c.epilogue_multiplies) is int


def test_model_for_refuses_bad_K_and_unknown_config_models():
    c = NumericContract(inputs="x", output="bfloat16", model="fp32_rn", config_model=lambda *a, **k: "bogus")
    with pytest.raises(ValueError, match="K="):
        c.model_for(None, 0)
    with pytest.raises(ValueError, match="bogus"):
        c.model_for(object(), 64)


def test_from_dict_reads_the_short_form():
    c = NumericContract.from_dict({"accumulation_model": "hopper_fp16_wgmma", "output_rounding_interpreter":
                                   "faithful", "inputs": "fp16 x fp16", "epilogue_multiplies": 1,
                                   "notes": {"nan": "propagates"}}, output="bfloat16")
    assert c.model == "hopper_fp16_wgmma" and c.model_interpreter == "hopper_fp16_wgmma"
    assert c.rounding_for(True) == "faithful" and c.rounding_for(False) == "rne"
    assert c.notes == {"nan": "propagates"} and c.inputs == "fp16 x fp16" and c.epilogue_multiplies == 1
    assert c.output == "bfloat16"
    assert NumericContract.from_dict({}, output="float16").model == bounds.DEFAULT_MODEL
    # a dict naming only output_rounding: the interpreter's run is held to it too (it was checked as rne)
    f = NumericContract.from_dict({"output_rounding": "faithful"}, output="bfloat16")
    assert f.rounding_for(True) == f.rounding_for(False) == "faithful"
    both = NumericContract.from_dict({"output_rounding": "faithful", "output_rounding_interpreter": "rne"},
                                     output="bfloat16")
    assert (both.rounding_for(False), both.rounding_for(True)) == ("faithful", "rne")
    assert NumericContract.from_dict({}, output="float16").rounding_for(True) == "rne"
    with pytest.raises(TypeError):
        NumericContract.from_dict(["accumulation_model"], output="float16")


def test_every_kernel_model_is_registered_in_the_library():
    """The NVFP4 GEMV's model lives in fp4ref.bounds itself, not as a side effect of importing a kernel."""
    assert bounds.get_model("fp32_rn_block16").eps(16 * 512) == pytest.approx(bounds.gamma(512, 2.0**-24))


@pytest.mark.parametrize("key", ["accumulation_modle", "nan", "model", "deterministc"])
def test_from_dict_refuses_an_unknown_key_instead_of_keeping_it_as_a_note(key):
    """{'accumulation_modle': 'exact'} gave model='tc_fp32_universal' (the loosest bound) and kept the typo as a
    note; an unknown key is a ValueError naming it and listing the known keys (notes go under 'notes')."""
    with pytest.raises(ValueError, match=rf"unknown key\(s\) '{key}'; the known keys are \['accumulation_model', "
                                         r"'accumulation_model_interpreter', 'output_rounding', "
                                         r"'output_rounding_interpreter', 'epilogue_multiplies', 'inputs', 'output', "
                                         r"'notes'\]"):
        NumericContract.from_dict({key: "exact"}, output="float16")
    with pytest.raises(TypeError, match="notes='propagates': expected a mapping"):
        NumericContract.from_dict({"notes": "propagates"}, output="float16")


def test_from_dict_takes_the_output_from_the_argument_or_the_dict():
    """docs: NumericContract.from_dict(d) reads the dict form. The output dtype comes from output= (what verify
    passes: the workload's) or the dict's "output" key; neither is a TypeError saying so, both must agree."""
    assert NumericContract.from_dict({"output": "bfloat16"}).output == "bfloat16"
    assert NumericContract.from_dict({"output": "float16"}, output="float16").output == "float16"
    assert NumericContract.from_dict({}, output="bfloat16").output == "bfloat16"
    with pytest.raises(TypeError, match="no output dtype: pass output='float16' or 'bfloat16', or give an 'output'"):
        NumericContract.from_dict({"accumulation_model": "fp32_rn"})
    with pytest.raises(ValueError, match="the dict's output='float16' differs from output='bfloat16'"):
        NumericContract.from_dict({"output": "float16"}, output="bfloat16")
    with pytest.raises(ValueError, match="output='float32'"):
        NumericContract.from_dict({"output": "float32"})


def test_interpreter_flag_must_be_a_bool_and_roundings_are_read_in_any_case():
    """os.environ.get("TRITON_INTERPRET") gives "0" or None, not a bool: the interpreter's (looser) contract must
    not be picked by a truthy string. Output roundings are names, read in any case as model names are."""
    c = bounds.NumericContract(inputs="float16", output="float16", model="hopper_fp16_wgmma",
                               model_interpreter="fp32_rn", output_rounding_interpreter="FAITHFUL")
    assert c.output_rounding_interpreter == "faithful" and c.rounding_for(np.bool_(True)) == "faithful"
    for bad in ("0", "False", 1, None):
        with pytest.raises(TypeError, match="interpreter="):
            c.model_for(None, 64, bad)
        with pytest.raises(TypeError, match="interpreter="):
            c.rounding_for(bad)
        with pytest.raises(TypeError, match="interpreter="):
            c.config_for(1, 64, 64, bad)
    ref = gemm.gemm_fp16(np.ones((1, 16), np.float16), np.ones((1, 16), np.float16))
    assert bounds.check(ref.out.copy(), ref, "fp32_rn", output_rounding="RNE").output_rounding == "rne"
    with pytest.raises(TypeError, match="output_rounding"):
        bounds.check(ref.out.copy(), ref, "fp32_rn", output_rounding=None)
    with pytest.raises(ValueError, match="output_rounding"):
        bounds.check(ref.out.copy(), ref, "fp32_rn", output_rounding="rtz")
