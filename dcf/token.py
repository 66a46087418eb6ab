"""The dead token: the value an untaken branch carries."""

from __future__ import annotations

from typing import Final


class _Dead:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DEAD"

    def __reduce__(self) -> str:
        return "DEAD"


DEAD: Final = _Dead()  # the only dead token; always compared with `is`


class WouldBlock(Exception):
    """Raised by an ASYNC kernel that must wait for `waitable` before it can run."""

    def __init__(self, waitable: object) -> None:
        super().__init__("would block")
        self.waitable = waitable
