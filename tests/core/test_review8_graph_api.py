"""Building graphs as a TF1 user writes library code, from review 8 of the graph API:
names, scopes and static shapes checked against TF1 (tensorflow.compat.v1)."""

from __future__ import annotations

import numpy as np
import pytest

import dcf


def _run(fetches, feed=None):
    with dcf.Session() as sess:
        return sess.run(fetches, feed)


# ------------------------------------------------------------------------ names
def test_a_name_ending_in_a_slash_is_the_ops_whole_name_as_tf1s_name_scope_idiom():
    # TF1's idiom: `with name_scope(name) as scope: ... return identity(y, name=scope)`
    # names the result after the scope itself ("double", "double_1"); it gave an op
    # named "double/double/" (a tensor "double/double/:0").
    g = dcf.Graph()
    with g.as_default():
        def double(x, name=None):
            with dcf.name_scope(name or "double") as scope:
                return dcf.identity(x * 2.0, name=scope)

        a = double(dcf.constant(1.0))
        b = double(a)
        with dcf.name_scope("outer"):
            c = double(b)
    assert [a.name, b.name, c.name] == ["double:0", "double_1:0", "outer/double:0"]
    assert g.get_tensor_by_name("double_1:0") is b
    assert g.get_operation_by_name("outer/double") is c.op
    # the scope's own ops keep their place under it, and later names stay unique
    assert g.get_operation_by_name("double_1/Mul").type == "Mul"
    with g.as_default():
        assert dcf.constant(0.0, name="double").name == "double_2:0"
        with pytest.raises(ValueError, match=r"'double_1' is already in the graph"):
            dcf.identity(a, name="double_1/")
    with dcf.Session(graph=g) as sess:
        assert sess.run(c) == 8.0


def test_name_scope_takes_tf1s_default_name_and_values():
    # TF1 library code opens `name_scope(name, "MyOp", [x])`: the default name where
    # name is None, and the graph of the values; dcf's took only `name` (a TypeError).
    g = dcf.Graph()
    with g.as_default():
        x = dcf.constant(1.0, name="x")

    def my_op(x, name=None):
        with dcf.name_scope(name, "MyOp", [x]) as scope:
            return dcf.identity(x * 3.0, name=scope)

    a, b, c = my_op(x), my_op(x), my_op(x, name="given")   # built outside g.as_default()
    assert [a.name, b.name, c.name] == ["MyOp:0", "MyOp_1:0", "given:0"]
    assert a.graph is g and g.get_operation_by_name("MyOp_1/Mul").graph is g
    with dcf.name_scope(None, "D") as s1, dcf.name_scope(None) as s2:
        assert (s1, s2) == ("D/", "")
    with g.as_default(), dcf.name_scope("o"), dcf.name_scope(None, "D", [x]) as s3:
        assert s3 == "o/D/"
    with pytest.raises(ValueError, match="name or default_name"):
        with dcf.name_scope(None, None, [x]):
            pass
    with dcf.Session(graph=g) as sess:
        assert sess.run(b) == 3.0


# ---------------------------------------------------------------- static shapes
def test_an_int_shape_is_a_vector_of_that_length_as_tf1s():
    # TF1 reads placeholder(dtype, 3) and TensorArray(element_shape=3) as the shape [3];
    # dcf failed on them with "TypeError: 'int' object is not iterable", naming nothing.
    x = dcf.placeholder(dcf.float32, 3, name="x3")
    assert x.shape == (3,)
    assert dcf.placeholder(dcf.float32, np.int64(2)).shape == (2,)
    assert dcf.placeholder(dcf.float32, np.array([2, 3])).shape == (2, 3)
    ta = dcf.TensorArray(dcf.float32, size=2, element_shape=3)
    assert ta.element_shape == (3,)
    ta = ta.write(0, x).write(1, x * 2.0)
    assert ta.stack().shape == (2, 3)
    np.testing.assert_array_equal(_run(ta.stack(), {x: [1.0, 2.0, 3.0]}),
                                  [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]])
    # a dimension that is not an int is refused, naming the op (int(2.5) made it 2)
    with pytest.raises(TypeError, match=r"Placeholder 'half': shape \[2\.5\] has a dimension"):
        dcf.placeholder(dcf.float32, [2.5], name="half")
    with pytest.raises(ValueError, match=r"Placeholder 'neg'.*negative dimension"):
        dcf.placeholder(dcf.float32, [-2, 3], name="neg")
    assert dcf.placeholder(dcf.float32, [-1, 3]).shape == (None, 3)


def test_a_shape_known_when_building_keeps_the_name_given():
    # shape/size/rank of a fully known shape become a Const (as TF1 folds them), and a
    # sliced constant shape too; the name given was dropped ("Const_3"), so
    # get_tensor_by_name("x_shape:0") failed where TF1 finds it.
    g = dcf.Graph()
    with g.as_default():
        x = dcf.zeros([2, 3])
        made = [dcf.shape(x, name="x_shape"), dcf.size(x, name="x_size"),
                dcf.rank(x, name="x_rank"),
                dcf.strided_slice(dcf.shape(x), (1,), name="x_cols")]
        unknown = dcf.placeholder(dcf.float32, [None, 3])
        made.append(dcf.shape(unknown, name="u_shape"))
    names = ["x_shape", "x_size", "x_rank", "x_cols", "u_shape"]
    assert [t.name for t in made] == [n + ":0" for n in names]
    assert [g.get_tensor_by_name(n + ":0") for n in names] == made
    with dcf.Session(graph=g) as sess:
        got = sess.run(made[:4])
    assert [np.asarray(v).tolist() for v in got] == [[2, 3], 6, 2, 3]
