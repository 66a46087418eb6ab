"""Fuse a loop's gradient accumulation into the kernel that makes each term (GPU).

The backward loop of a gradient sums the gradient of a loop-invariant value over the
iterations in a loop variable: acc(t+1) = acc(t) + MatMul(a(t), b(t)) for a weight
(BatchMatMulV2 for a stack of them: one strided-batched GEMM with beta = 1, its terms
never held), acc(t+1) = acc(t) + Sum(x(t), axis 0) for a bias. On a GPU each term costs two
launches and an allocation, and a loop of small kernels is bound by the host's cost
per launch (bench/NOTES.md). cuBLAS computes C = A B + C in one call (beta = 1), and a
column sum can add itself to its output, so the frame compiler emits one call that
writes into the accumulator -- where the graph proves nothing else sees its buffer:

- the Add's only consumer is the NextIteration feeding the loop's Merge;
- that Merge's only consumer is a Switch, whose true output reaches only the Add
  (through Identities, each with that one consumer); its false output may go to the
  loop's Exit, which takes the value only when the Add does not run;
- the MatMul or Sum has the Add as its only consumer, no control edges, and runs on
  the Add's GPU.

Then in every iteration after the first of one run of the loop, the value reaching the
Add is the Add's own result of the iteration before, held by nothing but the loop, and
the kernel updates it in place; the first iteration's value comes from outside the loop
and gets a new array (the ops one by one). The compiled frame passes the iteration
number. Results: the column sum adds the same float as the Sum then the Add (the same
bits); the GEMM rounds A B + C once instead of twice (last-bit differences). Anything
the fast kernels do not take (layouts, dtypes, the test stand-in) runs the term's own
kernel and adds it in place. (Traced runs take the executor's op-by-op path, where each
op is its own trace slice.)

Terms in chunks. A term of K rows (the batch) is a small GEMM: at an LSTM's sizes each
one reads and writes the whole accumulator for a product of K = 128 rows, and costs the
host a launch. The accumulations of one run of a loop hold their terms instead (the
compiled frame gives each call a list of its own for that run) and add CHUNK of them
at once: the terms' rows stacked (one kernel, dcf/ops/gpu_kernels.stack_rows), then one
GEMM (or column sum) over all their rows into the accumulator. sum_t a_t^T b_t is
[a_1; ...; a_k]^T [b_1; ...; b_k], and a column sum over stacked rows is the sum of the
column sums, so the value is the same up to rounding (the products are summed inside
one GEMM, then added to the accumulator once). The frame adds what is held when the
loop ends, before anything reads the accumulator. Only terms whose rows are what is
summed are held: a Sum over axis 0 of at most HOLD_ROWS rows, and a MatMul with
transpose_a and not transpose_b whose operands are small next to the accumulator
(HOLD_SHARE), of 2-D arrays of the accumulator's dtype and of one shape in the chunk
(anything else adds what is held first, then goes on as above). A strided operand is held
as a contiguous copy, so that a value's layout (a view left on the device, a fresh array
back from the host) never changes how the terms are summed. Under a memory limit a term
is held only while the device's use is below its swap threshold (held terms keep their
memory; past it, what is held is added at once, so the sums' last bits may depend on
memory pressure); with no limit, a chunk starts only below HOLD_DEVICE_SHARE of the
device's own memory; and where the stacks find no room the held terms are added one by
one. A held term is an array this frame keeps referring to: the in-place rules that look
at reference counts (dcf/fusion/in_place.py, the swapper) see it held and leave it alone.
"""

from __future__ import annotations

from typing import Any

from dcf.errors import node_error
from dcf.ops.gpu_kernels import STACK_ROWS_MAX, batched_gemm_accumulate, colsum_accumulate, \
    forget_stacks, gemm_accumulate, stack_rows
from dcf.ops.gpu_raw import c_contiguous
from dcf.ops.registry import Kind

__all__ = ["accumulate_groups", "FusedAccumulate", "CHUNK"]

# terms added at once (see the module docstring); at most STACK_ROWS_MAX
CHUNK = 16
# A GEMM's term is held only where its operands take at most this share of the
# accumulator's bytes: each term added alone reads and writes the whole accumulator,
# and stacking the operands writes and reads them once more (and from memory rather than
# the cache they were just made in). On an H200, LSTM 512 (accumulator 8 MiB): held at
# batch 64-256 the step was 10-12 % faster; at batch 512 (operands 6 MiB), where the GEMMs
# bound the step, 15 % slower in one run and 5 % faster in another.
HOLD_SHARE = 0.5
# A column sum's term is held only up to this many rows: its kernel has a thread per
# column that adds the rows in order, so a stack of tall terms is a long serial sum.
HOLD_ROWS = 256
# With no memory limit set, a chunk starts only while the device's use is below this
# share of its memory.
HOLD_DEVICE_SHARE = 0.9

_ADDS = ("Add", "AddV2")


def _only_consumer(n: Any) -> Any:
    if n.n_out < 1 or n.fetch or n.ctrl_outs or len(n.outs[0]) != 1 or \
            any(n.outs[k] for k in range(1, n.n_out)):
        return None
    return n.outs[0][0][0]


def _term_kind(t: Any, add: Any, gpu_of: dict, inputs_of: Any) -> str | None:
    if t is None or t.kind != Kind.KERNEL or t.pnode.control or \
            gpu_of.get(t.id) is not gpu_of[add.id] or _only_consumer(t) is not add:
        return None
    if t.type == "MatMul" and t.n_out == 1:
        return "matmul"
    if t.type == "BatchMatMulV2" and t.n_out == 1:
        return "batched"
    if t.type == "Sum" and t.n_out == 1 and not t.pnode.attrs.get("keepdims", False) and \
            len(inputs_of(t)) == 1 and t.pnode.attrs.get("axis") in (0, (0,), [0]):
        return "colsum"
    return None


def _loop_carried(src: Any, add: Any, inputs_of: Any) -> bool:
    """Whether `src` (a (NodeInfo, output) input of `add`) is the loop variable that
    `add` alone reads and alone feeds back (the module docstring's conditions)."""
    node, k = src
    reader = add
    while node is not None and node.kind == Kind.KERNEL and node.type == "Identity" \
            and k == 0:
        if _only_consumer(node) is not reader or node.pnode.control:
            return False
        reader = node
        ins = inputs_of(node)
        node, k = ins[0] if ins and ins[0] is not None else (None, 0)
    if node is None or node.kind != Kind.SWITCH or k != 1 or node.fetch or node.ctrl_outs:
        return False
    if [d for d, _, _ in node.outs[1]] != [reader]:
        return False
    if any(d.kind != Kind.EXIT for d, _, _ in node.outs[0]):
        return False
    data = inputs_of(node)[0]
    if data is None or data[1] != 0:
        return False
    merge = data[0]
    if merge is None or merge.kind != Kind.MERGE or merge.merge_n != 1 or merge.fetch or \
            merge.ctrl_outs or [d for d, _, _ in merge.outs[0]] != [node] or \
            any(merge.outs[k] for k in range(1, merge.n_out)):
        return False
    nxt = _only_consumer(add)
    if nxt is None or nxt.kind != Kind.NEXT_ITERATION or nxt.ctrl_outs:
        return False
    return [d for d, _, _ in nxt.outs[0]] == [merge]


def accumulate_groups(frame_nodes: list, gpu_of: dict, inputs_of: Any) -> dict:
    """Add node id -> (term node, kind, leaves [acc, term inputs...]) for the
    accumulations of one loop frame that may run as one in-place kernel."""
    groups: dict = {}
    for add in frame_nodes:
        if add.kind != Kind.KERNEL or add.type not in _ADDS or add.id not in gpu_of or \
                add.pnode.control or add.n_out != 1:
            continue
        ins = inputs_of(add)
        if len(ins) != 2 or None in ins or any(i[0] is None for i in ins):
            continue
        for j in (0, 1):
            acc, term = ins[j], ins[1 - j]
            kind = _term_kind(term[0], add, gpu_of, inputs_of) if term[1] == 0 else None
            if kind is not None and _loop_carried(acc, add, inputs_of):
                t_ins = inputs_of(term[0])
                if not t_ins or any(i is None or i[0] is None for i in t_ins):
                    break
                groups[add.id] = (term[0], kind, [acc] + list(t_ins), j)
                break
    return groups


class FusedAccumulate:
    """The callable of one fused accumulation: fn(acc, *term inputs, iteration, held),
    `held` the list the compiled frame keeps for this accumulation in one run of its
    loop ([] before the loop; `flush(held, iteration)` after it), or None (no terms
    held)."""

    holds_terms = True    # (the frame compiler gives its calls a held list per loop run)

    def __init__(self, gpu: Any, add: Any, term: Any, kind: str, acc_pos: int) -> None:
        self.gpu = gpu
        self.cp = gpu.cp
        self.add, self.term, self.kind = add, term, kind
        self.acc_pos = acc_pos
        attrs = term.pnode.attrs
        self.ta = bool(attrs.get("transpose_a", False))
        self.tb = bool(attrs.get("transpose_b", False))
        # whether the term sums over its operands' rows (then terms may be held; a
        # batched GEMM's terms are added one by one)
        self.rows = kind == "colsum" or (kind == "matmul" and self.ta and not self.tb)
        self.chunk = max(1, min(CHUNK, STACK_ROWS_MAX))
        self.share, self.max_rows = HOLD_SHARE, HOLD_ROWS
        self.in_place = 0               # in-place updates made, held terms counted (tests)
        self.flushes = 0                # chunks added (tests)

    def _term(self, args: tuple, it: Any) -> Any:
        try:
            return self.term.fn(*args)
        except Exception as e:
            raise node_error(self.term, it, e) from e

    def _holds(self, acc: Any, args: tuple) -> bool:
        """Whether this term may wait in a chunk (see the module docstring)."""
        nd = self.cp.ndarray
        if not self.rows or type(acc) is not nd or not c_contiguous(acc):
            return False
        for a in args:
            if type(a) is not nd or a.ndim != 2 or a.dtype != acc.dtype:
                return False
        if self.kind == "colsum":
            return acc.shape == (args[0].shape[1],) and args[0].shape[0] <= self.max_rows
        a, b = args
        return a.shape[0] == b.shape[0] and acc.shape == (a.shape[1], b.shape[1]) and \
            a.nbytes + b.nbytes <= self.share * acc.nbytes

    def flush(self, held: list, it: Any = None) -> None:
        """Add the terms held in `held` ([acc, the terms' shapes, term args, ...]) to
        acc; empty it."""
        if not held:
            return
        acc, terms = held[0], held[2:]
        del held[:]
        self.flushes += 1
        cp = self.cp
        if len(terms) == 1:
            self._add(acc, terms[0], it)
            return
        self.gpu.make_current()
        try:
            args = tuple(stack_rows(cp, [t[j] for t in terms]) for j in range(len(terms[0])))
        except self.gpu.oom_error:      # no room for the stacks: one term at a time
            for t in terms:
                self._add(acc, t, it)
            return
        except Exception as e:
            raise node_error(self.term, it, e) from e
        self._add(acc, args, it)

    def _room(self, starting: bool) -> bool:
        """Whether a term may be held: under a memory limit, only while the device's use
        is below the swap threshold of it (held terms keep their memory until added;
        past it, what is held is added at once). With no limit set, only where a chunk
        starts below HOLD_DEVICE_SHARE of the device's own memory (a read costs the host
        about a microsecond); the swap threshold plays no part there, so that swapping
        on or off never changes what is held."""
        g = self.gpu
        if g.limit is None:
            return not starting or g.used_bytes() < HOLD_DEVICE_SHARE * g.total_memory
        return g.used_bytes() < g.swap_threshold * g.limit

    def _same(self, shapes: tuple, args: tuple) -> bool:
        nd = self.cp.ndarray
        for a, shape in zip(args, shapes):
            if type(a) is not nd or a.shape != shape:
                return False
        return True

    def _hold(self, held: list, acc: Any, args: tuple, it: Any) -> Any:
        # an operand's layout must not decide what is held (a value that came back from
        # the host is contiguous where the same value left on the device may be a view):
        # a copy of a strided one, so that the sums are the same bits
        for a in args:
            if not c_contiguous(a):
                args = tuple(x if c_contiguous(x) else self.cp.ascontiguousarray(x)
                             for x in args)
                break
        held.append(args)
        self.in_place += 1
        if len(held) > self.chunk + 1:
            self.flush(held, it)
        else:                   # the stacks of the last flushes are not needed again
            forget_stacks()
        return acc

    def _add(self, acc: Any, args: tuple, it: Any) -> Any:
        """acc + the term of args: in place where it can be (returns acc), else a new
        array."""
        cp = self.cp
        self.gpu.make_current()
        if self.kind == "matmul":
            done = gemm_accumulate(cp, acc, args[0], args[1], self.ta, self.tb)
        elif self.kind == "batched":
            done = batched_gemm_accumulate(cp, acc, args[0], args[1], self.ta, self.tb)
        else:
            done = colsum_accumulate(cp, acc, args[0])
        if not done:      # the term's own kernel (it makes room when memory is short)
            p = self._term(args, it)
            if type(acc) is not type(p) or type(acc) is not cp.ndarray or \
                    acc.shape != p.shape or acc.dtype != p.dtype:
                return self.add.fn(acc, p) if self.acc_pos == 0 else self.add.fn(p, acc)
            cp.add(acc, p, out=acc)
        return acc

    def __call__(self, acc: Any, *args: Any) -> Any:
        held = args[-1]
        it = args[-2]
        args = args[:-2]
        if not it:        # the value came from outside the loop: a new array
            p = self._term(args, it)    # (held is a new, empty list in every run)
            return self.add.fn(acc, p) if self.acc_pos == 0 else self.add.fn(p, acc)
        if held:
            # the chunk's next term: the same accumulator, operands of the first one's
            # shapes (their dtypes are the graph's, the same in every iteration)
            if held[0] is acc and self._same(held[1], args) and self._room(False):
                return self._hold(held, acc, args, it)
            self.flush(held, it)
        if held is not None and self._holds(acc, args) and self._room(True):
            held.append(acc)
            held.append(tuple(a.shape for a in args))
            return self._hold(held, acc, args, it)
        out = self._add(acc, args, it)
        if out is acc:
            self.in_place += 1
        return out
