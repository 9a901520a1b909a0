"""Every entry of a model or adapter directory stays inside the model roots and is a file or directory.

Registration parses a few files (config.json, the index, safetensors headers), but the worker and the
agent read more later, found by name: tokenizer.json, tokenizer_config.json, chat templates, vocabularies,
generation_config.json, whatever a later transformers looks for. So every entry is judged, not a list of
names: its real path (symlinks resolved) must lie inside the roots, and it must not be a FIFO, device or
socket (a reader would block on it). Hidden entries (.git, .cache) are skipped: no reader looks for a
name that starts with a dot. The walk is bounded in entries and depth, as the directory is untrusted too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from agent.artifacts.errors import ArtifactError
from agent.artifacts.files import Roots
from agent.artifacts.limits import MAX_DIR_DEPTH, MAX_DIR_ENTRIES
from agent.artifacts.roots import OUTSIDE_ROOTS, OutsideModelRoots, inside, real_roots


def check_tree(path: Path, roots: Roots) -> None:
    """Refuse the first entry below directory `path` that resolves outside `roots` (when given) or is not a
    regular file or directory; symlinked directories inside the roots are walked too, each once."""
    bases = real_roots(roots) if roots is not None else None
    seen = {os.path.realpath(path)}
    stack, count = [(path, 0)], 0
    while stack:
        directory, depth = stack.pop()
        names = _names(directory, MAX_DIR_ENTRIES - count)
        if names is None:
            raise ArtifactError(f"{path}: holds more than {MAX_DIR_ENTRIES:,} files and directories; a model "
                                "directory holds tens to hundreds")
        count += len(names)
        for name in names:
            if name.startswith("."):
                continue
            entry = directory / name
            resolved = os.path.realpath(entry)
            if bases is not None and not inside(resolved, bases):
                raise OutsideModelRoots(f"{entry}: {OUTSIDE_ROOTS}")
            try:
                mode = os.stat(resolved).st_mode
            except OSError:
                continue  # a dangling or looping link inside the roots: nothing can be read through it
            if stat.S_ISDIR(mode):
                if resolved in seen:
                    continue
                if depth + 1 > MAX_DIR_DEPTH:
                    raise ArtifactError(f"{entry}: nests directories more than {MAX_DIR_DEPTH} levels below {path}")
                seen.add(resolved)
                stack.append((entry, depth + 1))
            elif not stat.S_ISREG(mode):
                raise ArtifactError(f"{entry}: is a FIFO, device or socket, not a regular file (a model directory "
                                    "holds only regular files and directories)")


def _names(directory: Path, budget: int) -> list[str] | None:
    """The names in `directory`, hidden ones included; None as soon as there are more than `budget`."""
    names: list[str] = []
    try:
        with os.scandir(directory) as entries:
            for e in entries:
                if len(names) >= budget:
                    return None
                names.append(e.name)
    except OSError as e:
        raise ArtifactError(f"{directory}: cannot be listed ({e.strerror})") from None
    return names
