"""RandomUniform bound to its node (random_ops._bind_random_uniform) draws exactly what
the generic kernel draws from a generator of the same seed: the same numbers in the same
order, the same dtypes, numpy scalars for shape ()."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest

from dcf import dtypes
from dcf.ops.random_ops import _random_uniform
from dcf.resources import DeviceResources


def _same(a, b) -> None:
    assert type(a) is type(b), (type(a), type(b))
    assert a.dtype == b.dtype and np.shape(a) == np.shape(b)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape", [(), (1,), (3,), (2, 2)])
@pytest.mark.parametrize("dtype,lo,hi", [(dtypes.int32, 0, 2), (dtypes.int32, -5, 1000),
                                         (dtypes.int64, 0, 7), (dtypes.float32, 0, 1),
                                         (dtypes.float32, -2, 3), (dtypes.float64, 0, 1)])
def test_bound_uniform_draws_the_generic_kernels_stream(shape, dtype, lo, hi):
    attrs = dict(shape=shape, dtype=dtype, seed=11, minval=lo, maxval=hi,
                 node_name="u")
    res = DeviceResources()
    bound = res.bind_kernel(SimpleNamespace(kernel=_random_uniform), dict(attrs, res=res))
    ref = functools.partial(_random_uniform, np, **attrs, res=DeviceResources())
    for _ in range(200):
        _same(bound(), ref())
    # the bound op draws from the generator the session keeps for the node
    assert res.rng("u", 11) is res._rngs["u"]
