"""The one rule set (``langchain_ascend.validation``): one rule per kind of value, each raising
the component's own errors. No torch, no components."""

from __future__ import annotations

import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from langchain_ascend import validation as v
from langchain_ascend.errors import (
    InvalidArgumentTypeError,
    InvalidRequestError,
    InvalidTextError,
    VectorStoreArgumentTypeError,
    VectorStoreInputError,
)

NOT_INTS = [True, False, 1.0, 2.5, "3", None, [1], np.bool_(True), Fraction(1, 1)]
NOT_NUMBERS = [True, False, "0.5", None, [0.5], b"1", np.bool_(False), complex(1, 0)]


@pytest.mark.parametrize("value", [0, 1, 7, 2**70, np.int64(3), np.uint8(2)])
def test_is_int_takes_real_integers(value):
    assert v.is_int(value)


@pytest.mark.parametrize("value", NOT_INTS)
def test_is_int_refuses_bools_floats_and_the_rest(value):
    assert not v.is_int(value)


@pytest.mark.parametrize("value", [0, 1.5, -3, np.float32(0.25), Fraction(1, 3), math.inf])
def test_is_number_takes_reals(value):
    assert v.is_number(value)


@pytest.mark.parametrize("value", NOT_NUMBERS)
def test_is_number_refuses_bools_and_non_reals(value):
    assert not v.is_number(value)


def test_a_count_is_an_integer_of_at_least_one():
    assert v.check_count("n", 1) == 1
    assert v.check_count("n", np.int64(4)) == 4
    assert v.check_count("n", None, allow_none=True) is None
    with pytest.raises(InvalidArgumentTypeError,
                       match=r"^n must be an integer >= 1, got bool True$"):
        v.check_count("n", True)
    with pytest.raises(InvalidRequestError, match=r"^n must be an integer >= 1, got 0$") as info:
        v.check_count("n", 0)
    assert not isinstance(info.value, TypeError)
    with pytest.raises(InvalidArgumentTypeError, match="got NoneType None"):
        v.check_count("n", None)
    with pytest.raises(InvalidArgumentTypeError, match=r"or None, got float 2\.0"):
        v.check_count("n", 2.0, allow_none=True)


@pytest.mark.parametrize("value", [x for x in NOT_INTS if x is not None])
def test_true_and_other_non_integers_are_never_counts(value):
    with pytest.raises(InvalidArgumentTypeError, match="max_batch_size must be an integer"):
        v.check_count("max_batch_size", value)


def test_int_bounds_and_custom_wording():
    assert v.check_int("k", 0, minimum=0) == 0
    assert v.check_int("seed", 2**63 - 1, minimum=0, maximum=2**63 - 1) == 2**63 - 1
    with pytest.raises(InvalidRequestError, match=r"seed must be an integer in \[0, 5\], got 6"):
        v.check_int("seed", 6, minimum=0, maximum=5)
    with pytest.raises(InvalidRequestError, match=r"x must be an integer <= 5, got 6"):
        v.check_int("x", 6, maximum=5)
    with pytest.raises(InvalidRequestError, match=r"top_k must be 0 \(off\) or more, got -1"):
        v.check_int("top_k", -1, minimum=0, what="0 (off) or more")
    assert v.int_bounds(None, None) == "an integer"


def test_numbers_are_finite_and_within_bounds():
    assert v.check_number("t", 0, minimum=0) == 0
    with pytest.raises(InvalidRequestError, match=r"^t must be a finite number >= 0, got nan$"):
        v.check_number("t", math.nan, minimum=0)
    for bad in (math.inf, -math.inf, 2**2000):  # an int beyond any float is not finite either
        with pytest.raises(InvalidRequestError):
            v.check_number("t", bad, minimum=0)
    with pytest.raises(InvalidRequestError, match=r"t must be a finite number > 0, got 0"):
        v.check_number("t", 0, minimum=0, open_min=True)
    with pytest.raises(InvalidRequestError, match=r"t must be a finite number < 1, got 1"):
        v.check_number("t", 1, maximum=1, open_max=True)
    with pytest.raises(InvalidArgumentTypeError, match=r"t must be a finite number, got bool"):
        v.check_number("t", True)
    with pytest.raises(InvalidArgumentTypeError, match=r"got str '0\.5'"):
        v.check_number("t", "0.5", minimum=0)
    assert v.check_number("t", None, allow_none=True) is None


def test_a_probability_is_in_the_unit_interval():
    assert v.check_probability("p", 0) == 0
    assert v.check_probability("p", 1.0) == 1.0
    with pytest.raises(InvalidRequestError, match=r"p must be a finite number in \(0, 1\], got 0"):
        v.check_probability("p", 0, open_min=True)
    with pytest.raises(InvalidRequestError, match=r"\[0, 1\], got 1\.5"):
        v.check_probability("p", 1.5)
    with pytest.raises(InvalidArgumentTypeError):
        v.check_probability("p", True)


def test_a_flag_is_exactly_true_or_false():
    assert v.check_flag("f", True) is True
    assert v.check_flag("f", False) is False
    assert v.check_flag("f", None, allow_none=True) is None
    for bad in (1, 0, "yes", None, np.bool_(True)):
        with pytest.raises(InvalidArgumentTypeError, match="f must be True or False"):
            v.check_flag("f", bad)


def test_a_choice_is_one_of_the_set():
    assert v.check_choice("mode", "auto", ("auto", "off")) == "auto"
    for bad in ("AUTO", None, True, ["auto"], {"a": 1}):
        with pytest.raises(InvalidRequestError, match=r"mode must be one of \['auto', 'off'\]"):
            v.check_choice("mode", bad, ("auto", "off"))
    with pytest.raises(InvalidRequestError):
        v.check_choice("n", True, (1, 2))  # True does not stand for 1
    assert v.check_choice("b", True, (True, "auto")) is True


def test_the_component_errors_are_raised():
    with pytest.raises(VectorStoreArgumentTypeError, match="k must be an integer >= 0"):
        v.check_int("k", True, minimum=0, errors=v.STORE)
    with pytest.raises(VectorStoreInputError, match="k must be an integer >= 0, got -1"):
        v.check_int("k", -1, minimum=0, errors=v.STORE)

    class Mine(ValueError):
        pass

    with pytest.raises(Mine):
        v.check_count("n", 0, errors=v.Errors(Mine, Mine))
    for errors in (v.REQUEST, v.STORE):  # every error is a ValueError, type errors TypeErrors
        assert issubclass(errors.value, ValueError) and issubclass(errors.type, ValueError)
        assert issubclass(errors.type, TypeError)


def test_a_list_where_one_str_is_one_item_or_a_mistake():
    assert v.as_items("stop", "###", str_is_item=True, error=TypeError) == ["###"]
    assert v.as_items("stop", ("a", "b"), str_is_item=True, error=TypeError) == ["a", "b"]
    assert v.as_items("ids", iter(["x"]), str_is_item=True, error=TypeError) == ["x"]
    assert v.as_items("stop", None, str_is_item=True, error=TypeError, allow_none=True) is None
    with pytest.raises(VectorStoreArgumentTypeError, match=r"texts must be a list, got the str "
                       r"'abc'; wrap one item in a list"):
        v.as_items("texts", "abc", str_is_item=False, error=VectorStoreArgumentTypeError)
    for bad in ({"a": 1}, 5, None):
        with pytest.raises(TypeError, match="texts must be a list"):
            v.as_items("texts", bad, str_is_item=False, error=TypeError)


def test_text_must_be_encodable():
    v.check_text("t", "fine ü", InvalidTextError)
    with pytest.raises(InvalidTextError, match=r"t holds .* at position 3"):
        v.check_text("t", "ok \ud800", InvalidTextError)


def test_long_values_are_cut_in_messages():
    with pytest.raises(InvalidArgumentTypeError) as info:
        v.check_count("n", "x" * 500)
    assert len(str(info.value)) < 120 and str(info.value).endswith("...")


def test_the_module_imports_no_torch():
    code = ("import sys, langchain_ascend.validation, langchain_ascend.chat.checks, "
            "langchain_ascend.engine.core.sampling_params; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_device_and_dtype_spellings():
    for device in ("auto", "cpu", "npu", "npu:1", "CUDA:0", " cuda "):
        assert v.check_device(device) == device
    for bad in ("cpu:1", "tpu", "npu:", None, 0):
        with pytest.raises(InvalidRequestError, match=r"device=.* is not a device"):
            v.check_device(bad)
    with pytest.raises(VectorStoreInputError, match="'cpu:1'"):
        v.check_device("cpu:1", errors=v.STORE)
    for dtype in ("auto", "float32", "BF16", "torch.float16", "half"):
        assert v.check_dtype(dtype) == dtype
    for bad in ("float8", None, 32):
        with pytest.raises(InvalidRequestError, match="is not supported"):
            v.check_dtype(bad)
