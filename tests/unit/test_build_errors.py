"""Mistakes caught while the graph is built, each with its message pinned: mismatched
cond branches, bad while_loop conditions and loop variables, op shape errors with the
user's file:line, and tensors used outside the cond/while_loop that made them."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import dcf
from dcf.errors import InvalidArgumentError

TRUE = True


def _line_of(marker: str) -> int:
    """1-based line number of the line of this file that ends with `marker`."""
    lines = pathlib.Path(__file__).read_text().splitlines()
    return 1 + next(k for k, line in enumerate(lines) if line.endswith(marker))


# ------------------------------------------------------------------------- cond
def test_cond_branches_with_different_structures_name_both():
    p = dcf.placeholder(dcf.bool, ())
    with pytest.raises(
        ValueError,
        match=r"cond 'pick': true_fn and false_fn must return the "
        r"same structure:\n  \* at top level: tuple of length 2 "
        r"vs a single value",
    ):
        dcf.cond(
            p,
            lambda: (dcf.constant(1.0), dcf.constant(2.0)),
            lambda: dcf.constant(1.0),
            name="pick",
        )
    with pytest.raises(ValueError, match=r"at top level: keys \['a'\] vs \['b'\]"):
        dcf.cond(p, lambda: {"a": dcf.constant(1.0)}, lambda: {"b": dcf.constant(1.0)})
    with pytest.raises(ValueError, match=r"at \[1\]: length 1 vs 2"):
        dcf.cond(p, lambda: (1.0, [2.0]), lambda: (1.0, [2.0, 3.0]))


def test_cond_branches_with_different_dtypes_name_both():
    p = dcf.placeholder(dcf.bool, ())
    with pytest.raises(
        TypeError,
        match=r"cond 'cond': true_fn and false_fn must return the "
        r"same structure and types:\n  \* at output\[1\]: "
        r"true_fn returned float32\[\], false_fn returned "
        r"int32\[\]",
    ):
        dcf.cond(
            p,
            lambda: (dcf.constant(1), dcf.constant(1.0)),
            lambda: (dcf.constant(1), dcf.constant(1)),
        )


def test_cond_branch_returning_none_is_a_type_error_and_an_op_a_bool():
    p = dcf.placeholder(dcf.bool, ())
    with pytest.raises(TypeError, match=r"cond 'cond': false_fn returned None"):
        dcf.cond(p, lambda: dcf.constant(1.0), lambda: None)
    # an op stands for the branch's pivot, run after it (TF1's rule): a bool tensor
    done = dcf.cond(p, lambda: dcf.no_op(), lambda: dcf.no_op())
    assert done.dtype == dcf.bool
    with pytest.raises(TypeError, match=r"(?s)cond 'cond_2'.*bool.*float32"):
        dcf.cond(p, lambda: dcf.no_op(), lambda: dcf.constant(1.0))



def test_cond_and_case_positional_bool_for_name_points_at_tf1s_argument():
    # TF1's case(pairs, default, exclusive) and cond(pred, t, f, strict): ported
    # positionally, the bool reached name_scope ("'bool' object has no attribute 'endswith'")
    x = dcf.constant(1.0)
    p = dcf.constant(True)
    with pytest.raises(TypeError, match=r"case: name must be a string, got True; TF1's case "
                       r"takes exclusive in that position: pass it by keyword \(exclusive="):
        dcf.case([(p, lambda: x)], lambda: x, True)
    with pytest.raises(TypeError, match=r"cond: name must be a string, got False; TF1's cond "
                       r"takes strict in that position: dcf's cond has no strict="):
        dcf.cond(p, lambda: x, lambda: x, False)


def test_case_arguments_that_are_not_pairs_or_callables_name_case():
    # these raised "'Tensor' object is not callable", "tensor ... is not iterable" or
    # named the cond case builds on
    x = dcf.constant(1.0)
    p = dcf.constant(True)
    with pytest.raises(TypeError, match=r"case: default must be a callable of no arguments, "
                       r"got <dcf.Tensor 'Const:0'"):
        dcf.case([(p, lambda: x)], default=x)
    with pytest.raises(TypeError, match=r"case: pred_fn_pairs\[1\] must be a \(pred, fn\) "
                       r"pair, got <dcf.Tensor 'Const_1:0'"):
        dcf.case([(p, lambda: x), p], default=lambda: x)
    with pytest.raises(TypeError, match=r"case: the fn of pred_fn_pairs\[0\] must be a "
                       r"callable of no arguments"):
        dcf.case([(p, x)], default=lambda: x)

def test_cond_pred_must_be_a_scalar_bool_tensor():
    with pytest.raises(
        TypeError,
        match=r"cond 'cond': pred must be a scalar bool tensor, got "
        r"float32\[\]",
    ):
        dcf.cond(dcf.constant(1.0), lambda: 1.0, lambda: 2.0)
    with pytest.raises(TypeError, match=r"pred must be a scalar bool tensor, got bool\[2\]"):
        dcf.cond(dcf.constant([True, False]), lambda: 1.0, lambda: 2.0)


def test_cond_pred_that_is_a_python_bool_is_a_type_error():
    i = dcf.placeholder(dcf.int32, ())
    with pytest.raises(TypeError, match=r"Python bool"):
        dcf.cond(i % 2 == 0, lambda: i, lambda: -i)


# ------------------------------------------------------------------- while_loop
def test_while_cond_returning_a_python_bool_gives_the_hint():
    with pytest.raises(
        TypeError,
        match=r"while_loop 'while': cond returned a Python bool "
        r"\(True\), not a dcf bool tensor.\n  Probably cond uses "
        r"`if`, `and` or `or` on tensors; use dcf.logical_and / "
        r"dcf.cond instead",
    ):
        dcf.while_loop(lambda i: TRUE, lambda i: i + 1, 0)


def test_while_cond_returning_a_non_bool_tensor_is_a_type_error():
    with pytest.raises(
        TypeError,
        match=r"while_loop 'count': cond must return a scalar bool "
        r"tensor, got int32\[\]",
    ):
        dcf.while_loop(lambda i: i, lambda i: i + 1, 0, name="count")


def test_while_body_returning_another_structure_is_a_value_error():
    with pytest.raises(
        ValueError,
        match=r"while_loop 'while': body must return the same "
        r"structure as loop_vars:\n  \* at top level: length 2 "
        r"vs 3",
    ):
        dcf.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x, x), (0, 1.0))



def test_none_from_a_body_branch_or_scan_fn_names_the_construct():
    # these named an internal Const ("Const 'while/Const': cannot convert None")
    x = dcf.constant([1.0, 2.0])
    with pytest.raises(TypeError, match=r"while_loop 'w1': body returned None; it must return "
                       r"the loop vars' new values \(a missing `return`\?\)"):
        dcf.while_loop(lambda a: dcf.constant(True), lambda a: None, x, name="w1")
    with pytest.raises(TypeError, match=r"while_loop 'w2': body returned None for loop var 1"):
        dcf.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, None), (0, x), name="w2")
    with pytest.raises(TypeError, match=r"cond 'c' \(true branch\) returned None at "
                       r"output\[1\]; return a tensor there"):
        dcf.cond(dcf.constant(True), lambda: (x, None), lambda: (x, x), name="c")
    with pytest.raises(TypeError, match=r"scan: fn returned None; it must return a tensor"):
        dcf.scan(lambda a, e: None, x)

def test_while_loop_var_changing_dtype_is_a_type_error():
    with pytest.raises(
        TypeError,
        match=r"while_loop 'while': loop var 1 enters as float32 but "
        r"body returns int32",
    ):
        dcf.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, i), (0, 1.0))


def test_loop_var_shape_change_needs_shape_invariants(compiled, run_graph):
    def body(i, x):
        return i + 1, dcf.concat([x, x], 0)

    with pytest.raises(
        ValueError,
        match=r"while_loop 'grow': loop var 1 has shape \[1\] when "
        r"it enters the loop but \[2\] after one iteration; "
        r"pass shape_invariants",
    ):
        dcf.while_loop(lambda i, x: i < 3, body, (0, dcf.constant([1.0])), name="grow")
    _, x = dcf.while_loop(
        lambda i, x: i < 3,
        body,
        (0, dcf.constant([1.0])),
        shape_invariants=((), (None,)),
        name="grow_ok",
    )
    assert x.shape == (None,)
    np.testing.assert_array_equal(run_graph(x, config=compiled), np.ones(8))


def test_parallel_iterations_below_one_is_refused():
    with pytest.raises(ValueError, match=r"parallel_iterations must be >= 1, got 0"):
        dcf.while_loop(lambda i: i < 3, lambda i: i + 1, 0, parallel_iterations=0)


# ---------------------------------------------------------------------- op errors
def test_op_shape_error_names_op_type_name_and_user_line():
    a = dcf.ones([2, 3])
    b = dcf.ones([4, 5])
    with pytest.raises(InvalidArgumentError) as info:
        dcf.matmul(a, b, name="proj")  # marker: matmul-site
    msg = str(info.value)
    assert msg.startswith("MatMul 'proj': ")
    assert "float32[2,3]" in msg and "float32[4,5]" in msg
    line = _line_of("# marker: matmul-site")
    assert (
        f"op created at test_build_errors.py:{line} in "
        "test_op_shape_error_names_op_type_name_and_user_line()" in msg
    )


def test_op_error_inside_a_loop_body_names_the_scoped_op():
    def body(i, x):
        return i + 1, dcf.matmul(x, dcf.ones([3, 3]), name="mm")

    with pytest.raises(
        InvalidArgumentError,
        match=r"MatMul 'rnn/mm': .*\n  inputs: "
        r"float32\[2,2\], float32\[3,3\]",
    ):
        dcf.while_loop(lambda i, x: i < 2, body, (0, dcf.ones([2, 2])), name="rnn")


# ------------------------------------------------------ values escaping a construct
def test_tensor_made_in_a_cond_branch_cannot_be_used_outside_it():
    leaked = []

    def true_fn():
        leaked.append(dcf.constant(1.0) * 2.0)
        return leaked[0]

    dcf.cond(dcf.placeholder(dcf.bool, ()), true_fn, lambda: dcf.constant(0.0))
    with pytest.raises(
        ValueError,
        match=r"Add 'Add': input 'cond/Mul:0' was created inside "
        r"cond 'cond' \(true branch\) and cannot be used outside "
        r"it; use the outputs of the cond/while_loop instead",
    ):
        leaked[0] + 1.0


def test_tensor_made_in_a_loop_body_cannot_be_used_outside_it():
    leaked = []

    def body(i):
        leaked.append(i * 2)
        return i + 1

    dcf.while_loop(lambda i: i < 3, body, 0, name="loop")
    with pytest.raises(
        ValueError,
        match=r"input 'loop/Mul:0' was created inside while_loop "
        r"'loop' and cannot be used outside it",
    ):
        leaked[0] + 1


def test_tensor_made_in_one_cond_cannot_be_used_in_another():
    x = dcf.constant(1.0)
    p = dcf.placeholder(dcf.bool, ())
    leaked = []

    def first():
        leaked.append(x * 2.0)
        return leaked[0]

    dcf.cond(p, first, lambda: x, name="first")
    with pytest.raises(
        ValueError,
        match=r"tensor 'first/Mul:0' was created inside cond 'first' "
        r"\(true branch\) and cannot be used in cond 'second' "
        r"\(true branch\); pass it out through the outputs",
    ):
        dcf.cond(p, lambda: leaked[0] + 1.0, lambda: x, name="second")


def test_python_bool_of_a_tensor_is_refused_with_a_hint():
    x = dcf.constant(1.0)
    with pytest.raises(
        TypeError,
        match=r"using the tensor 'Greater:0' as a Python bool is not "
        r"allowed.*dcf.cond",
    ):
        if x > 0.0:
            pass


def test_constant_of_an_unsigned_int_past_the_signed_range_is_refused():
    """uint64 2**63 as an int64 wrapped to -2**63 (the value round-trips, so the check
    missed it); an in-range one is converted."""
    with pytest.raises(TypeError, match=r"Const 'big'.*would change its value"):
        dcf.constant(np.uint64(2**63), dtype=dcf.int64, name="big")
    with pytest.raises(TypeError, match=r"would change its value"):
        dcf.constant(np.array([1, 2**64 - 1], np.uint64), dtype=dcf.int64)
    with dcf.Session() as sess:
        assert sess.run(dcf.constant(np.uint64(2**40), dtype=dcf.int64)) == 2**40
