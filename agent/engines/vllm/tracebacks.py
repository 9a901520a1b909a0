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
# A process's prefix on the lines it prints through vLLM's server ("(EngineCore_DP0 pid=4242) "), then its logger's
# on a traceback it logs, line by line ("ERROR 12-07 01:44:17 [multiproc_executor.py:1063] ").
_PREFIX = re.compile(r"^(?:\((?:[\w.-]+ )?pid=\d+\)\s?)?"
                     r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) [\d-]+ [\d:.]+ \[[^\]]*\] )?")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)(?:: .*)?$")
# Exceptions that only point at another one: never the line that says why.
_WRAPPERS = ("See root cause above", "Engine core initialization failed", "EngineCore encountered an issue",
             "check the stack trace above for the root cause", "EngineDeadError", "EngineGenerateError")


# What follows a pydantic ValidationError's own lines: a link, and the input echoed back.
_PYDANTIC_LINK = "For further information visit"
_PYDANTIC_INPUT = re.compile(r"\s*\[type=.*\]$")


class Tracebacks:
    """Fed vLLM's output line by line; keeps the exception lines of the tracebacks it printed (with the indented
    lines that continue one: a pydantic ValidationError, which vLLM's configuration raises, says why on those)."""

    def __init__(self) -> None:
        self.exceptions: deque[str] = deque(maxlen=KEPT)
        self._inside = False  # after "Traceback (most recent call last):", before its exception line
        self._continued = False  # just after an exception line: indented lines go on with it

    def feed(self, line: str) -> None:
        text = _PREFIX.sub("", line.rstrip())
        if self._continued and text[:1].isspace() and not text.lstrip().startswith(("File ", _PYDANTIC_LINK)):
            more = _PYDANTIC_INPUT.sub("", text.strip())
            self.exceptions[-1] = f"{self.exceptions[-1]}; {more}"[:MAX_CHARS]
            return
        self._continued = False
        if text.startswith("Traceback (most recent call last)"):
            self._inside = True
        elif self._inside and text and not text[0].isspace() and _EXCEPTION.match(text):
            self.exceptions.append(text[:MAX_CHARS])
            self._inside, self._continued = False, True

    def cause(self) -> str:
        """The root cause among the exception lines kept ("" for none): the first that is no wrapper, else the
        last of them."""
        found = list(self.exceptions)
        return next((e for e in found if not any(w in e for w in _WRAPPERS)), found[-1] if found else "")
