"""Review 9 by use of TensorArray and map_fn/foldl/foldr/scan, each test against TF1
(tensorflow.compat.v1 with control flow v1) or numpy."""

from __future__ import annotations

import pytest

import dcf


@pytest.mark.parametrize("call", [
    lambda elems: dcf.map_fn(lambda x: 1.0, elems),
    lambda elems: dcf.scan(lambda a, x: a, elems, initializer=0.0),
    lambda elems: dcf.foldl(lambda a, x: a, elems, initializer=0.0),
    lambda elems: dcf.foldr(lambda a, x: a, elems, initializer=0.0),
])
@pytest.mark.parametrize("elems", [[], (), {}])
def test_elems_with_no_tensor_is_a_value_error_naming_the_function(call, elems):
    # TF's map_fn: "elems must be a Tensor or (possibly nested) sequence of Tensors";
    # here an IndexError from inside the first dimension's look-up
    with pytest.raises(ValueError, match=r"(map_fn|scan|foldl|foldr): elems must be a "
                                         r"tensor or a nested structure"):
        call(elems)
