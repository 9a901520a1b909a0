"""The line of vLLM's output that says why it failed: the exception line of a traceback (pure, no I/O).

vLLM prints its root cause in its engine core's traceback, then its API server's own traceback, whose exception
only wraps it ("Engine core initialization failed. See root cause above"), then shutdown noise (the resource
tracker's warnings). The last lines of its log are that noise; the root cause is the first exception line that is
not a wrapper, among the tracebacks it printed last.
"""

from __future__ import annotations

import re
from collections import deque

KEPT = 8  # exception lines remembered: a chain's root cause and its wrappers, and a little before
MAX_CHARS = 600
# A process's prefix on the lines it prints through vLLM's server: "(EngineCore_DP0 pid=4242) ".
_PREFIX = re.compile(r"^\((?:[\w.-]+ )?pid=\d+\)\s?")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)(?:: .*)?$")
# Exceptions that only point at another one: never the line that says why.
_WRAPPERS = ("See root cause above", "Engine core initialization failed", "EngineCore encountered an issue",
             "EngineDeadError", "EngineGenerateError")


class Tracebacks:
    """Fed vLLM's output line by line; keeps the exception lines of the tracebacks it printed."""

    def __init__(self) -> None:
        self.exceptions: deque[str] = deque(maxlen=KEPT)
        self._inside = False  # after "Traceback (most recent call last):", before its exception line

    def feed(self, line: str) -> None:
        text = _PREFIX.sub("", line.rstrip())
        if text.startswith("Traceback (most recent call last)"):
            self._inside = True
        elif self._inside and text and not text[0].isspace() and _EXCEPTION.match(text):
            self.exceptions.append(text[:MAX_CHARS])
            self._inside = False

    def cause(self) -> str:
        """The root cause among the exception lines kept ("" for none): the first that is no wrapper, else the
        last of them."""
        found = list(self.exceptions)
        return next((e for e in found if not any(w in e for w in _WRAPPERS)), found[-1] if found else "")
