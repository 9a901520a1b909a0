"""The line of llama-server's output that says why it failed (pure, no I/O).

llama.cpp logs a failed load in layers: the loader's own cause ("llama_model_load: error loading model: missing
tensor ..."), the file parser's ("gguf_init_from_file_impl: tensor ... data is not within the file bounds"), then
wrappers that only say it failed ("failed to load model", "exiting due to model loading error"). A bad argument
is one "error: ..." line; a C++ exception the server did not catch is "what(): ...". The cause is the first line
of the most telling kind.
"""

from __future__ import annotations

import re

MAX_CHARS = 600
# Most telling first: each pattern's first match wins over any later kind's.
_CAUSES = (
    re.compile(r"error loading model: (?P<why>.+)"),
    re.compile(r"^gguf_\w+: (?P<why>.*(?:fail|invalid|error|not within|mismatch|unknown|too large|exceeds).*)",
               re.IGNORECASE),
    re.compile(r"what\(\):\s*(?P<why>.+)"),
    re.compile(r"^(?:\w+: )?(?P<why>error: .+)"),
    re.compile(r"^(?:[\w:]+: )?(?P<why>.*(?:unknown model architecture|unsupported|not supported).*)", re.IGNORECASE),
)
# Lines that only say that something failed, never why.
_WRAPPERS = ("failed to load model", "exiting due to model loading error")


def failure_reason(lines: list[str]) -> str:
    """The line among `lines` (oldest first) that says why llama-server failed; "" when none does."""
    text = [_strip(line) for line in lines]
    for pattern in _CAUSES:
        for line in text:
            found = pattern.search(line)
            if found and not any(w in line for w in _WRAPPERS):
                return found.group("why").strip()[:MAX_CHARS]
    return ""


def _strip(line: str) -> str:
    # Its log prefixes a level and a timestamp when those are on ("0.00.012.345 E "); they say nothing of why.
    return re.sub(r"^\d+\.\d+\.\d+\.\d+ [DIWE] ", "", line.rstrip())
