"""The error tree every dcf failure belongs to, and the formatting of op errors."""

from __future__ import annotations

from typing import Any


class DcfError(Exception):
    """Base class of all dcf runtime errors."""


class InvalidArgumentError(DcfError, ValueError):
    """An op received an argument it cannot work with."""


class OutOfRangeError(DcfError, IndexError):
    """An index or a queue ran out of range."""


class WorkerError(DcfError):
    """A worker process died or stopped answering."""


class DeadlineExceededError(DcfError, TimeoutError):
    """A run took longer than RunOptions(timeout_s=...)."""


class ResourceExhaustedError(DcfError, MemoryError):
    """A device memory budget was exceeded."""


class CancelledError(DcfError):
    """A run was cancelled because another part of it failed."""


def describe_op(op: Any) -> str:
    """`<Type> '<name>'` with the device when it is known."""
    text = f"{op.type} '{op.name}'"
    device = getattr(op, "device", "")
    return f"{text} on {device}" if device else text


def op_error(op: Any, frame: str | None, iteration: int | None, cause: BaseException,
             outer: tuple = ()) -> DcfError:
    """Wrap an exception raised while running `op` into the matching DcfError.

    The message leads with the op, says where (device, frame, iteration, and for a
    nested loop the enclosing loops' frames and iterations, innermost first: `outer`
    holds their (frame, iteration) pairs), then what was wrong, then where the op was
    created.
    """
    if isinstance(cause, DcfError) and getattr(cause, "_dcf_located", False):
        return cause
    where = describe_op(op)
    if frame is not None:
        where += f", frame '{frame or '<root>'}' iteration {iteration}"
        for name, it in outer:
            where += f", inside frame '{name}' iteration {it}"
    try:
        detail = str(cause) or type(cause).__name__
    except Exception as e:  # noqa: BLE001 - a user's exception whose __str__ fails
        detail = f"<its __str__ raised {type(e).__name__}: {e}>"
    if not isinstance(cause, DcfError):
        detail = f"{type(cause).__name__}: {detail}"
    site = getattr(op, "site", None)
    msg = f"{where}: {detail}"
    if site:
        msg += f"\n  op created at {site}"
    cls: type[DcfError]
    if isinstance(cause, DcfError):
        cls = type(cause)
    elif isinstance(cause, IndexError):
        cls = OutOfRangeError
    elif isinstance(cause, MemoryError):
        cls = ResourceExhaustedError
    else:
        cls = InvalidArgumentError
    err = cls(msg)
    err._dcf_located = True  # type: ignore[attr-defined]
    return err


def node_error(node: Any, iteration: Any, cause: BaseException,
               outer: tuple = ()) -> DcfError:
    """op_error for a node of an execution plan (a NodeInfo: its op, and its frame and
    iteration inside a loop; the root frame has neither)."""
    in_loop = node.frame.parent is not None
    return op_error(node.op if node.op is not None else node,
                    node.frame.name if in_loop else None, iteration if in_loop else None,
                    cause, outer if in_loop else ())
