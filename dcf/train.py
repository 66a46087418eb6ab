"""Optimizers and checkpoints."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import tempfile
import threading
import weakref
import zipfile
from typing import Any

import numpy as np

from dcf.autodiff import gradients
from dcf.errors import InvalidArgumentError
from dcf.graph import Operation, Tensor, get_default_graph
from dcf.ops import array_ops, math_ops
from dcf.ops.control_ops import group, placeholder
from dcf.ops.registry import convert_to_tensor
from dcf.ops.state_ops import (Variable, _fits, apply_adam, global_variables,
                                trainable_variables)

__all__ = ["Optimizer", "GradientDescentOptimizer", "AdamOptimizer", "Saver",
           "latest_checkpoint"]


class Optimizer:
    """Base class: `minimize(loss)` = `apply_gradients(compute_gradients(loss))`."""

    def __init__(self, learning_rate: float, name: str) -> None:
        self.learning_rate = learning_rate
        self.name = name

    def compute_gradients(self, loss: Tensor, var_list: list[Variable] | None = None
                          ) -> list[tuple[Tensor | None, Variable]]:
        """(gradient, variable) pairs; gradient None where loss does not depend on it."""
        vs = list(var_list) if var_list is not None else trainable_variables()
        if not vs:
            raise ValueError(f"{self.name}: no variables to optimize")
        return list(zip(gradients(loss, vs), vs))

    def apply_gradients(self, grads_and_vars: list, name: str | None = None, *,
                        global_step: Variable | None = None) -> Operation:
        """An op that applies the gradients (and then adds 1 to `global_step`, if given,
        as TF's does)."""
        g = get_default_graph()
        with g.name_scope(name or self.name):
            updates = [self._apply(gr, v) for gr, v in grads_and_vars if gr is not None]
            if not updates:
                raise ValueError(f"{self.name}: no gradients flow to any variable")
            return _counted(group(*updates, name="update"), global_step)

    def minimize(self, loss: Tensor, var_list: list[Variable] | None = None,
                 name: str | None = None, *,
                 global_step: Variable | None = None) -> Operation:
        """An op that takes one optimization step on `loss` (and adds 1 to `global_step`,
        an integer Variable, once the variables are updated, as TF's does)."""
        return self.apply_gradients(self.compute_gradients(loss, var_list), name=name,
                                    global_step=global_step)

    def _apply(self, grad: Tensor, var: Variable) -> Any:
        raise NotImplementedError


def _counted(update: Operation, global_step: Variable | None) -> Operation:
    """`update`, or an op adding 1 to `global_step` after it (TF's apply_gradients)."""
    if global_step is None:
        return update
    if not isinstance(global_step, Variable):
        raise TypeError(f"global_step must be a dcf.Variable, got {global_step!r}")
    with update.graph.control_dependencies([update]):
        return global_step.assign_add(
            convert_to_tensor(1, dtype=global_step.dtype), name="global_step_add").op


def _lr_as(learning_rate: Any, dtype: Any) -> Tensor:
    """The learning rate as a tensor of the variable's dtype: a Python number is made
    one, a tensor (a float32 placeholder, say, for float64 variables) is cast, as TF's
    optimizers cast theirs."""
    if isinstance(learning_rate, (int, float, np.number, np.ndarray)):
        return convert_to_tensor(learning_rate, dtype=dtype)   # (no float32 rounding)
    lr = convert_to_tensor(learning_rate)                      # a Tensor or a Variable
    return lr if lr.dtype == dtype else math_ops.cast(lr, dtype)


class GradientDescentOptimizer(Optimizer):
    """`var -= learning_rate * grad`."""

    def __init__(self, learning_rate: float, name: str = "GradientDescent") -> None:
        super().__init__(learning_rate, name)

    def _apply(self, grad: Tensor, var: Variable) -> Any:
        return var.assign_sub(_lr_as(self.learning_rate, var.dtype) * grad)


class AdamOptimizer(Optimizer):
    """Adam (Kingma & Ba): bias-corrected first and second moment estimates.

        t += 1; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
        var -= lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps)
    """

    def __init__(self, learning_rate: float = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, name: str = "Adam") -> None:
        super().__init__(learning_rate, name)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self._slots: dict[Variable, tuple[Variable, Variable]] = {}
        self._powers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def apply_gradients(self, grads_and_vars: list, name: str | None = None, *,
                        global_step: Variable | None = None) -> Operation:
        pairs = [(gr, v) for gr, v in grads_and_vars if gr is not None]
        if not pairs:
            raise ValueError(f"{self.name}: no gradients flow to any variable")
        g = get_default_graph()
        dt = pairs[0][1].dtype
        with g.name_scope(name or self.name):
            # one pair of powers per optimizer and graph (TF's non-slot variables), shared
            # by every minimize() of this optimizer, as the moments are
            powers = self._powers.get(g)
            if powers is None:
                # in the variables' float type, but never narrower than float32: in
                # float16, beta2^t drifts by a third over 3,000 steps (TF keeps them in
                # float32 and casts the rate to each variable's type)
                pdt = dt.np if dt.np.itemsize >= 4 else np.float32
                powers = self._powers[g] = (
                    Variable(np.asarray(1.0, pdt), name="beta1_power", trainable=False),
                    Variable(np.asarray(1.0, pdt), name="beta2_power", trainable=False))
            b1p, b2p = powers
            dt = b1p.dtype   # (a later minimize() may update variables of another dtype)
            # beta1, beta2 and epsilon may be tensors (TF1's; a placeholder, a Variable),
            # cast to each variable's dtype as TF's are (the fused op's inputs, then)
            hyper = (self.beta1, self.beta2, self.epsilon)
            fixed = all(isinstance(x, (int, float, np.number)) for x in hyper)
            # this step's powers; the Variables take them only once every update has
            # (as TF's _finish): a step that fails leaves them as they were
            nb1 = b1p * (self.beta1 if fixed else _lr_as(self.beta1, dt))
            nb2 = b2p * (self.beta2 if fixed else _lr_as(self.beta2, dt))
            lr_t = _lr_as(self.learning_rate, dt) * math_ops.sqrt(1.0 - nb2) / (1.0 - nb1)
            updates = []
            for gr, var in pairs:
                # one fused op per variable (TF's ResourceApplyAdam): the moments are
                # updated in place, with the float operations of the formula above
                m, v = self._slot(var)
                lr = math_ops.cast(lr_t, var.dtype)
                b1, b2, eps = hyper if fixed else (_lr_as(x, var.dtype) for x in hyper)
                if var.device == m.device == v.device:
                    updates.append(apply_adam(var, m, v, lr, gr, b1, b2, eps))
                    continue
                # moments placed elsewhere (see _slot): the same update op by op
                m_new = m.assign(m * b1 + gr * (1.0 - b1))
                v_new = v.assign(v * b2 + math_ops.square(gr) * (1.0 - b2))
                step = lr * m_new / (math_ops.sqrt(v_new) + eps)
                updates.append(var.assign_sub(step))
            with g.control_dependencies(updates):
                powers = [b1p.assign(nb1), b2p.assign(nb2)]
            return _counted(group(*updates, *powers, name="update"), global_step)

    def _slot(self, var: Variable) -> tuple[Variable, Variable]:
        s = self._slots.get(var)
        if s is None:
            # the moments live with their variable (as TF's slots are colocated with it):
            # the update is one op reading all three handles, which must share a process
            dev = var.device
            with var.graph.device(dev) if dev else contextlib.nullcontext():
                s = tuple(Variable(lambda: self._zeros(var), name=f"{var.name}/{slot}",
                                   trainable=False, validate_shape=var.shape is not None)
                          for slot in ("Adam", "Adam_1"))
            self._slots[var] = s
        return s

    @staticmethod
    def _zeros(var: Variable) -> Any:
        """A moment's initial value: zeros of var's shape. A variable without a static
        shape (validate_shape=False, an initial value fed) gets moments of the shape its
        value has when they are initialized (TF1's create_zeros_slot), not scalars.
        (Called by the Variable, outside any cond or loop body apply_gradients is in.)"""
        if var.shape is not None:
            return np.zeros(var.shape, var.dtype.np)
        return array_ops.zeros_like(var.initialized_value())


class Saver:
    """Save and restore variables.

    A checkpoint is one .npz file (numpy arrays, never pickle). `save` writes a
    temporary file in the same directory, fsyncs it and renames it over the target,
    so a crash mid-save leaves the previous checkpoint intact.

    `var_list` is a list of Variables, saved under their names, or a dict from the
    names to save them under to Variables (TF1's); None: every variable of the graph.
    With an AsyncSession, `save` and `restore` return awaitables (`await
    saver.save(sess, path)`), as its `run` does.

    As TF1's: `save(..., global_step=)` appends the step to the path; the directory's
    `checkpoint.json` names its checkpoints, newest last (`latest_checkpoint(dir)`); of
    the checkpoints this Saver wrote, only the newest `max_to_keep` are kept (None or 0:
    all of them).
    """

    def __init__(self, var_list: list[Variable] | dict[str, Variable] | None = None,
                 max_to_keep: int | None = 5) -> None:
        if max_to_keep is not None and (isinstance(max_to_keep, bool) or
                                        not isinstance(max_to_keep, (int, np.integer)) or
                                        max_to_keep < 0):
            raise ValueError(f"Saver(max_to_keep={max_to_keep!r}): give a count >= 0, or "
                             "None to keep every checkpoint")
        self.max_to_keep = int(max_to_keep or 0)
        self._written: list[str] = []       # this Saver's checkpoints, oldest first
        named = _named_variables(global_variables() if var_list is None else var_list)
        if not named:
            raise ValueError("Saver: there are no variables to save")
        self._keys = [k for k, _ in named]
        self.var_list = [v for _, v in named]
        if len(set(self._keys)) != len(self._keys):
            raise ValueError(f"Saver: duplicate variable names in {self._keys}")
        first: dict[Variable, str] = {}
        for k, v in named:
            if v in first:
                # (a restore would assign it twice in one run: which value it kept would
                # depend on the order the two assigns ran; TF1's Saver refuses it too)
                raise ValueError(f"Saver: variable '{v.name}' is given twice, as "
                                 f"'{first[v]}' and as '{k}'; give each variable one name")
            first[v] = k
        g = self.var_list[0].graph
        # (outside any cond or loop body and any control_dependencies the Saver is made
        # in: a save must not run the training step it was built next to)
        with g.as_default(), g._control_flow_context(None), g.name_scope("save"):
            self._reads = [v.read_value() for v in self.var_list]
            self._feeds = [placeholder(v.dtype, v.shape) for v in self.var_list]
            self._restore = group(*[v.assign(p) for v, p in zip(self.var_list, self._feeds)],
                                  name="restore_all")

    def save(self, sess: Any, save_path: str, global_step: Any = None) -> Any:
        """Write every variable's value to `save_path` (atomically), or to
        `save_path-STEP` with a `global_step` (a number, or a Variable or tensor read in
        the same run); returns the path (an awaitable of it, from an AsyncSession)."""
        step_fetch = [] if global_step is None or _is_number(global_step) else [global_step]
        if step_fetch and not isinstance(global_step, (Tensor, Variable)):
            raise TypeError(f"Saver.save: global_step is an integer, a Variable or a tensor, "
                            f"not {global_step!r}")
        values = sess.run(self._reads + step_fetch)
        if inspect.isawaitable(values):        # an AsyncSession's run
            return self._write_when_read(values, save_path, global_step)
        return self._saved(values, save_path, global_step)

    async def _write_when_read(self, values: Any, save_path: str, global_step: Any) -> str:
        # (the file is written and synced on a worker thread: the service's event loop
        # goes on meanwhile)
        return await asyncio.to_thread(self._saved, await values, save_path, global_step)

    def _saved(self, values: list, save_path: str, global_step: Any) -> str:
        """Write a checkpoint of `values` (with the step's value last where it was read),
        list it in the directory's index and drop this Saver's oldest beyond
        max_to_keep; returns its path."""
        if global_step is not None:
            step = values.pop() if not _is_number(global_step) else global_step
            save_path = f"{save_path}-{_step_number(step)}"
        path = _npz_path(save_path)
        self._write(path, values)
        # Saves from several threads (a Session's, an AsyncSession's worker threads) each
        # read, change and write back this Saver's list and the directory's index: one at
        # a time, or an index written from an older read drops the checkpoints listed
        # meanwhile, and the list loses track of checkpoints max_to_keep should remove.
        with _BOOKKEEPING:
            if path in self._written:
                self._written.remove(path)
            self._written.append(path)
            gone = self._written[:-self.max_to_keep] if self.max_to_keep else []
            del self._written[:len(gone)]
            _update_index(os.path.dirname(os.path.abspath(path)), path, gone)
            for old in gone:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(old)
        return path

    def _write(self, path: str, values: list) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        _write_durably(path, ".ckpt-", "wb",
                       lambda f: _write_npz(f, list(zip(self._keys, values))))

    def restore(self, sess: Any, save_path: str) -> Any:
        """Assign every variable the value stored in `save_path` (all of them, or none
        where a value is missing or does not fit)."""
        if save_path is None:      # (latest_checkpoint found none: say so, as TF1)
            raise ValueError("Saver.restore: save_path is None (no checkpoint to restore; "
                             "latest_checkpoint returns None where a directory has none)")
        path = _npz_path(save_path)
        if inspect.iscoroutinefunction(getattr(sess, "run", None)):    # an AsyncSession's
            return self._restore_when_read(sess, path)
        return sess.run(self._restore, self._restore_feed(path))

    async def _restore_when_read(self, sess: Any, path: str) -> Any:
        # (the file is read and checked on a worker thread, as save writes it: the
        # service's event loop goes on meanwhile)
        return await sess.run(self._restore,
                              await asyncio.to_thread(self._restore_feed, path))

    def _restore_feed(self, path: str) -> dict:
        """The restore op's feeds: checkpoint `path`'s values, each checked to fit."""
        values = _read_checkpoint(path, self._keys)
        feed = {}
        for k, v, p in zip(self._keys, self.var_list, self._feeds):
            _check_restorable(v, values[k], path)
            feed[p] = values[k]
        return feed


_INDEX = "checkpoint.json"
_BOOKKEEPING = threading.Lock()     # Savers' lists of their checkpoints, and the indexes


def latest_checkpoint(checkpoint_dir: str) -> str | None:
    """The path of the newest checkpoint a Saver wrote in `checkpoint_dir` (TF1's
    tf.train.latest_checkpoint), or None where there is none."""
    try:
        with open(os.path.join(checkpoint_dir, _INDEX), encoding="utf-8") as f:
            names = json.load(f).get("checkpoints", [])
    except FileNotFoundError:
        return None
    for name in reversed(names):
        path = os.path.join(checkpoint_dir, name)
        if os.path.exists(path):
            return path
    return None


def _update_index(directory: str, path: str, gone: list[str]) -> None:
    """List `path` last in the directory's index (written atomically), without `gone`."""
    index = os.path.join(directory, _INDEX)
    try:
        with open(index, encoding="utf-8") as f:
            names = list(json.load(f).get("checkpoints", []))
    except (FileNotFoundError, ValueError):
        names = []
    drop = {os.path.basename(p) for p in gone} | {os.path.basename(path)}
    names = [n for n in names if n not in drop] + [os.path.basename(path)]
    _write_durably(index, ".index-", "w", lambda f: json.dump({"checkpoints": names}, f))


def _write_durably(path: str, prefix: str, mode: str, write: Any) -> None:
    """`write(f)` into a new file that becomes `path` atomically and durably: written to
    a temporary file in path's directory (the mode the umask gives: mkstemp's 0600 is for
    its name only), on disk before it is renamed to path, and the rename on disk before
    this returns -- a crash leaves the previous file or the new one, never an empty or
    partial one. Nothing is left behind where it fails."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
    try:
        os.chmod(tmp, 0o666 & ~_umask())
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _sync_directory(directory)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _sync_directory(directory: str) -> None:
    """fsync a directory: a rename in it is on disk once this returns."""
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _step_number(step: Any) -> int:
    value = np.asarray(step)
    if value.shape != () or not np.issubdtype(value.dtype, np.integer):
        raise TypeError(f"Saver.save: global_step must be an integer scalar, got {step!r}")
    return int(value)


def _named_variables(var_list: Any) -> list[tuple[str, Variable]]:
    """(name in the checkpoint, Variable) pairs of a Saver's var_list."""
    if isinstance(var_list, dict):
        named = list(var_list.items())
    else:
        named = [(getattr(v, "name", None), v) for v in var_list]
    for key, v in named:
        if not isinstance(v, Variable) or not isinstance(key, str):
            raise TypeError(f"Saver: var_list takes Variables, or a dict from names (str) "
                            f"to Variables; got {key!r}: {v!r}")
    return named


def _npz_path(save_path: str) -> str:
    return save_path if save_path.endswith(".npz") else save_path + ".npz"


def _write_npz(f: Any, items: list) -> None:
    """An uncompressed .npz of `items` ((name, array) pairs), as np.savez writes one, but
    with names taken as they are (savez's keyword arguments cannot be "file" or
    "allow_pickle")."""
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in items:
            with zf.open(name + ".npy", "w", force_zip64=True) as out:
                np.lib.format.write_array(out, np.asanyarray(value), allow_pickle=False)


def _read_checkpoint(path: str, keys: list[str]) -> dict[str, np.ndarray]:
    """The arrays stored under `keys` in checkpoint `path`. A file that is not a
    checkpoint (truncated, corrupted, another format) is an InvalidArgumentError naming
    it, where numpy's errors spoke of zip files or of pickled data; a missing key is a
    KeyError."""
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("it holds one array, not a .npz of named arrays")
        with data:
            # by member name: NpzFile's own lookup takes "x.npy" for the member of "x"
            # where there is one (a variable named "x.npy" got x's value)
            members = set(data.zip.namelist())
            missing = [k for k in keys if k + ".npy" not in members]
            if missing:
                raise KeyError(f"checkpoint {path} has no values for {missing}")
            return {k: data[k + ".npy"] for k in keys}
    except (ValueError, EOFError, zipfile.BadZipFile) as e:
        why = f"{type(e).__name__}: {e}"
        if "allow_pickle=" in why and "Object arrays" not in why:
            why = "it is not a .npz file"   # (numpy's guess: pickled data, to load unsafely)
        raise InvalidArgumentError(
            f"checkpoint {path} cannot be read as a checkpoint a Saver wrote: {why}") from e


def _check_restorable(var: Variable, value: np.ndarray, path: str) -> None:
    """Raise InvalidArgumentError unless `value` (from checkpoint `path`) has var's
    dtype and fits its shape (TF's RestoreV2 refuses both, naming the variable)."""
    want = var.dtype.np
    if value.dtype != want:
        raise InvalidArgumentError(
            f"checkpoint {path}: variable '{var.name}' is {var.dtype} but the checkpoint "
            f"holds {value.dtype}")
    if var.shape is not None and not _fits(value.shape, var.shape):
        raise InvalidArgumentError(
            f"checkpoint {path}: variable '{var.name}' has shape {list(var.shape)} but the "
            f"checkpoint holds shape {list(value.shape)}")


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)      # (elsewhere: read it by setting it, and set it back)
    os.umask(mask)
    return mask
