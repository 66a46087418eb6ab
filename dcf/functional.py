"""map_fn, foldl, foldr and scan, defined on while_loop + TensorArray (the paper's
scan figure): elements are unstacked into TensorArrays, a loop reads one element per
iteration, and results are written to TensorArrays that are stacked after the loop."""

from __future__ import annotations

from typing import Any, Callable

from dcf import dtypes, nest
from dcf.control_flow import while_loop
from dcf.graph import Operation, Tensor, shape_str
from dcf.ops.registry import apply, convert_to_tensor, graph_of
from dcf.tensor_array import TensorArray

__all__ = ["map_fn", "foldl", "foldr", "scan"]


def _leading_dim(xs: list[Tensor], what: str) -> Any:
    if not xs:      # (as TF's map_fn: nothing to take the number of elements from)
        raise ValueError(f"{what}: elems must be a tensor or a nested structure with at "
                         "least one tensor, got one with none")
    dims = [x.shape[0] for x in xs if x.shape is not None and len(x.shape) > 0]
    if any(x.shape is not None and len(x.shape) == 0 for x in xs):
        raise ValueError(f"{what}: elems must have a leading dimension to iterate over")
    known = {d for d in dims if d is not None}
    if len(known) > 1:
        raise ValueError(f"{what}: elems have different first dimensions {sorted(known)}")
    if known:
        return known.pop()
    from dcf.ops.array_ops import shape

    return shape(xs[0])[0]


def _unstacked(xs: list[Tensor], n: Any, reverse: bool = False) -> list[TensorArray]:
    tas = []
    for x in xs:
        ta = TensorArray(x.dtype, size=n, element_shape=None if x.shape is None else x.shape[1:],
                         name="elems")
        tas.append(ta.unstack(x))
    return tas


def map_fn(fn: Callable[..., Any], elems: Any, dtype: Any = None,
           parallel_iterations: int | None = None, back_prop: bool = True,
           swap_memory: bool = False, infer_shape: bool = True, name: str | None = None) -> Any:
    """`stack([fn(x) for x in unstack(elems)])`, as an in-graph loop.

    `elems` may be a nested structure of tensors sharing their first dimension;
    `fn` then receives the same structure of slices. Its output structure is
    inferred when `dtype` is None; a given `dtype` is the structure (and dtypes) fn must
    return, else ValueError/TypeError at build time (a Python number in fn's output
    becomes a tensor of its dtype, as TF's). `parallel_iterations` None is 10 (TF1's);
    `infer_shape=False` lets fn's outputs differ in shape from one element to the next
    (the stack then needs them alike, as TF's).
    """
    if parallel_iterations is None:
        parallel_iterations = 10
    g = graph_of(nest.flatten(elems))  # the loop is built in elems' graph
    with g.as_default(), g.name_scope(name or "map"):
        flat = [convert_to_tensor(e) for e in nest.flatten(elems)]
        n = _leading_dim(flat, "map_fn")
        elem_tas = _unstacked(flat, n)
        if dtype is None:
            return _map_inferred(g, fn, elems, flat, n, elem_tas, parallel_iterations,
                                 back_prop, swap_memory, infer_shape)
        out_dtypes = nest.flatten(dtype)
        acc = [TensorArray(dt, size=n, infer_shape=infer_shape, name="result")
               for dt in out_dtypes]

        def body(i: Tensor, accs: list) -> tuple:
            xs = nest.pack_sequence_as(elems, [ta.read(i) for ta in elem_tas])
            out = fn(xs)
            # (as TF's: a structure other than dtype's would be packed into dtype's
            # silently, a dict's values in key order)
            diff = nest.structure_diff(dtype, out)
            if diff:
                raise ValueError("map_fn: fn must return the structure given by dtype=:\n"
                                 f"  * {diff}")
            ys = _fn_outputs(out, "map_fn", out_dtypes)
            for k, (y, dt) in enumerate(zip(ys, out_dtypes)):
                if y.dtype is not dtypes.as_dtype(dt):
                    raise TypeError(f"map_fn: fn returned {y.dtype} at output[{k}] where "
                                    f"dtype= says {dtypes.as_dtype(dt)}")
            return i + 1, [a.write(i, y) for a, y in zip(accs, ys)]

        _, accs = while_loop(lambda i, _: i < n, body, (convert_to_tensor(0), acc),
                             parallel_iterations=parallel_iterations, back_prop=back_prop,
                             swap_memory=swap_memory)
        return nest.pack_sequence_as(dtype, [a.stack() for a in accs])


def _map_inferred(g: Any, fn: Callable[..., Any], elems: Any, flat: list, n: Any,
                  elem_tas: list, parallel_iterations: int, back_prop: bool,
                  swap_memory: bool, infer_shape: bool) -> Any:
    """map_fn with its output structure taken from fn's one trace, in the loop body.

    The result arrays can only be made once fn's outputs are known: the body makes them
    (in the loop's outer context), and one flow, a loop variable, orders all their
    writes (each iteration's writes join into the next iteration's flow; the arrays
    are stacked after the loop with the final one). fn runs once at build time, so
    the variables it creates are made once, as in TF."""
    outer = g._ctx
    made: dict = {}
    n_t = convert_to_tensor(n)
    with g.control_dependencies(None):
        flow0 = apply("TensorArrayFlowJoin", [], name="results_flow")

    def body(i: Tensor, flow: Tensor) -> tuple:
        xs = nest.pack_sequence_as(elems, [ta.read(i) for ta in elem_tas])
        out = fn(xs)
        ys = _fn_outputs(out, "map_fn")
        with g._control_flow_context(outer), g.control_dependencies(None):
            accs = [TensorArray(y.dtype, size=n_t, infer_shape=infer_shape, name="result")
                    for y in ys]
        made["struct"], made["accs"] = out, accs
        if not ys:
            return i + 1, flow
        flows = [a._with_flow(flow).write(i, y).flow for a, y in zip(accs, ys)]
        return i + 1, (flows[0] if len(flows) == 1 else
                       apply("TensorArrayFlowJoin", flows, name="results_flow"))

    _, flow = while_loop(lambda i, _: i < n, body, (convert_to_tensor(0), flow0),
                         parallel_iterations=parallel_iterations, back_prop=back_prop,
                         swap_memory=swap_memory)
    struct = nest.map_structure(lambda t: convert_to_tensor(t).dtype, made["struct"])
    return nest.pack_sequence_as(struct, [a._with_flow(flow).stack() for a in made["accs"]])


def _fn_outputs(out: Any, what: str, want: list | None = None) -> list[Tensor]:
    """The tensors of fn's output, with an error naming `what` for a leaf that is not one
    (None, an op, a TensorArray); a Python number becomes a tensor of its `want` dtype
    (as TF's write)."""
    ys = []
    for k, y in enumerate(nest.flatten(out)):
        if y is None or isinstance(y, (Operation, TensorArray)):
            raise TypeError(f"{what}: fn returned {'None' if y is None else repr(y)}"
                            f"{'' if not nest.is_nested(out) else f' at output[{k}]'}; it "
                            "must return a tensor or a nested structure of tensors")
        dt = None if want is None or isinstance(y, Tensor) else dtypes.as_dtype(want[k])
        ys.append(convert_to_tensor(y) if dt is None else convert_to_tensor(y, dtype=dt))
    return ys


def _fold(fn: Callable[..., Any], elems: Any, initializer: Any, reverse: bool, what: str,
          parallel_iterations: int, back_prop: bool, swap_memory: bool) -> tuple:
    flat = [convert_to_tensor(e) for e in nest.flatten(elems)]
    n = _leading_dim(flat, what)
    elem_tas = _unstacked(flat, n)
    if initializer is None:
        first = n - 1 if reverse else 0
        init = nest.pack_sequence_as(elems, [ta.read(first) for ta in elem_tas])
        start = 1
    else:
        # (a TensorArray accumulator is a loop var as it is, as in TF's foldl/foldr)
        init = nest.map_structure(
            lambda t: t if isinstance(t, TensorArray) else convert_to_tensor(t), initializer)
        start = 0
    return flat, n, elem_tas, init, start


def foldl(fn: Callable[..., Any], elems: Any, initializer: Any = None,
          parallel_iterations: int = 10, back_prop: bool = True, swap_memory: bool = False,
          name: str | None = None) -> Any:
    """`functools.reduce(fn, unstack(elems), initializer)` as an in-graph loop."""
    return _foldx(fn, elems, initializer, False, name or "foldl", parallel_iterations,
                  back_prop, swap_memory)


def foldr(fn: Callable[..., Any], elems: Any, initializer: Any = None,
          parallel_iterations: int = 10, back_prop: bool = True, swap_memory: bool = False,
          name: str | None = None) -> Any:
    """foldl over the elements in reverse order."""
    return _foldx(fn, elems, initializer, True, name or "foldr", parallel_iterations,
                  back_prop, swap_memory)


def _foldx(fn, elems, initializer, reverse, name, pi, back_prop, swap_memory):
    g = graph_of(nest.flatten(elems) + nest.flatten(initializer))
    with g.as_default(), g.name_scope(name):
        flat, n, elem_tas, init, start = _fold(fn, elems, initializer, reverse, name, pi,
                                               back_prop, swap_memory)

        def body(i, acc):
            idx = (n - 1 - i) if reverse else i
            x = nest.pack_sequence_as(elems, [ta.read(idx) for ta in elem_tas])
            return i + 1, fn(acc, x)

        _, out = while_loop(lambda i, _: i < n, body, (convert_to_tensor(start), init),
                            parallel_iterations=pi, back_prop=back_prop, swap_memory=swap_memory)
        return out


def scan(fn: Callable[..., Any], elems: Any, initializer: Any = None,
         parallel_iterations: int = 10, back_prop: bool = True, swap_memory: bool = False,
         infer_shape: bool = True, reverse: bool = False, name: str | None = None) -> Any:
    """All intermediate accumulators of a fold:

        acc = initializer; out = []
        for x in elems: acc = fn(acc, x); out.append(acc)
        return stack(out)

    With no initializer, elems[0] is the first accumulator (and the first output).
    `reverse=True` goes from the last element to the first (outputs keep elems' order);
    `infer_shape=False` lets the outputs differ in shape (TF1's arguments).
    """
    g = graph_of(nest.flatten(elems) + nest.flatten(initializer))
    with g.as_default(), g.name_scope(name or "scan"):
        flat, n, elem_tas, init, start = _fold(fn, elems, initializer, reverse, "scan",
                                               parallel_iterations, back_prop, swap_memory)
        init_flat = nest.flatten(init)
        if any(isinstance(t, TensorArray) for t in init_flat):
            raise TypeError("scan: initializer holds a TensorArray; scan stacks its "
                            "accumulators, which must be tensors (as TF's; foldl and foldr "
                            "take TensorArrays)")
        accs = [TensorArray(t.dtype, size=n, element_shape=t.shape if infer_shape else None,
                            infer_shape=infer_shape, name="result")
                for t in init_flat]
        if start == 1:
            first = n - 1 if reverse else 0
            accs = [a.write(first, t) for a, t in zip(accs, init_flat)]

        def body(i, acc, outs):
            idx = (n - 1 - i) if reverse else i
            x = nest.pack_sequence_as(elems, [ta.read(idx) for ta in elem_tas])
            new = fn(acc, x)
            new_flat = _fn_outputs(new, "scan")
            _check_like_accumulator(new_flat, init_flat, infer_shape)
            return i + 1, new, [o.write(idx, t) for o, t in zip(outs, new_flat)]

        _, _, outs = while_loop(lambda i, *_: i < n, body,
                                (convert_to_tensor(start), init, accs),
                                parallel_iterations=parallel_iterations, back_prop=back_prop,
                                swap_memory=swap_memory)
        return nest.pack_sequence_as(init, [o.stack() for o in outs])


def _check_like_accumulator(new_flat: list[Tensor], init_flat: list[Tensor],
                            infer_shape: bool) -> None:
    """fn's outputs against the accumulator's dtypes (and, with infer_shape, static
    shapes), naming scan: the first write of a wrong one named only the internal
    'scan/result' TensorArray (a structure that differs is while_loop's error)."""
    for k, (t, a) in enumerate(zip(new_flat, init_flat)):
        if t.dtype is not a.dtype:
            raise TypeError(f"scan: fn returned {t.dtype} at output[{k}] where the "
                            f"accumulator (initializer, else elems) is {a.dtype}")
        ts, as_ = t.shape, a.shape
        if infer_shape and ts is not None and as_ is not None and (
                len(ts) != len(as_) or any(d is not None and e is not None and d != e
                                           for d, e in zip(ts, as_))):
            raise ValueError(f"scan: fn returned shape {shape_str(ts)} at output[{k}] "
                             f"where the accumulator (initializer, else elems) has shape "
                             f"{shape_str(as_)}")
