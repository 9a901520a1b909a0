"""The gateway's refusal of a request: what every layer of it raises, and the API families word (errors.py)."""

from __future__ import annotations


class Refused(Exception):
    """A request the gateway will not send on: an HTTP status, a reason, and a Retry-After when it helps."""

    def __init__(self, status: int, message: str, retry_after: float | None = None, code: str = "",
                 callers: bool = False) -> None:
        super().__init__(message)
        self.status, self.retry_after, self.code = status, retry_after, code
        self.callers = callers  # the caller's own limit (its token's, its team's): no other deployment would take it
