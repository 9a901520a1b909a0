"""Model roots: the only directories artifact paths may point into (MODELGRID_MODEL_ROOTS).

A path is resolved (symlinks included) before it is compared with the roots, and every path that
lands outside gets the same message whether or not it exists there, so the console cannot be used
to probe the host's file system. Inside the roots, messages are specific.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path, PurePath
from typing import Literal

from agent.artifacts.errors import ArtifactError, shown

OUTSIDE_ROOTS = "path is outside the model roots (MODELGRID_MODEL_ROOTS) or does not exist"
Kind = Literal["dir", "file", "any"]
_PATH_MAX = 4096  # Linux's PATH_MAX: no longer path can be opened anyway
_KIND_WORDS = {"dir": "a directory", "file": "a regular file", "any": "a regular file or directory"}


class OutsideModelRoots(ArtifactError):
    """A path that resolves outside the model roots; the message never says whether it exists."""


def real_roots(roots: Sequence[str | os.PathLike]) -> tuple[str, ...]:
    """The roots with their symlinks resolved; ArtifactError when none are configured."""
    if not roots:
        raise ArtifactError("no model roots are configured (MODELGRID_MODEL_ROOTS is empty)")
    return tuple(os.path.realpath(os.fspath(r)) for r in roots)


def inside(resolved: str, roots: Sequence[str]) -> bool:
    """Whether the resolved path `resolved` is one of the resolved `roots` or below one."""
    p = PurePath(resolved)
    return any(p.is_relative_to(root) for root in roots)


def resolve_in_roots(path: str | os.PathLike, roots: Sequence[str | os.PathLike], *, kind: Kind = "any") -> Path:
    """The real path of `path` when it lies inside one of `roots` and is of `kind`; ArtifactError otherwise.

    A relative path is taken from the first root. `~` is never expanded and `..` is refused
    (it would let a caller learn where symlinks outside the roots point). Everything that
    resolves outside the roots raises OutsideModelRoots with one fixed message.
    """
    text = path if isinstance(path, str) else os.fspath(path) if isinstance(path, os.PathLike) else None
    if not isinstance(text, str):
        raise ArtifactError("path must be text")
    if len(text) > _PATH_MAX:
        raise ArtifactError(f"path is {len(text):,} characters long; at most {_PATH_MAX:,} are accepted")
    if not text.strip():
        raise ArtifactError("path is empty")
    if "\0" in text:
        raise ArtifactError("path contains a NUL character")
    if text.startswith("~"):
        raise ArtifactError(f"{shown(text)}: '~' is not expanded; give an absolute path inside the model roots "
                            "(MODELGRID_MODEL_ROOTS) or one relative to the first root")
    if ".." in PurePath(text).parts:
        raise ArtifactError(f"{shown(text)}: '..' is not accepted in a path; give the path inside the model roots "
                            "(MODELGRID_MODEL_ROOTS) directly")
    bases = real_roots(roots)
    resolved = os.path.realpath(os.path.join(bases[0], text))  # join keeps an absolute `text` as it is
    if not inside(resolved, bases):
        raise OutsideModelRoots(OUTSIDE_ROOTS)
    check_kind(resolved, kind, text)
    return Path(resolved)


def check_kind(resolved: str, kind: Kind, given: str) -> None:
    """Check that `resolved` (inside the roots) exists and is of `kind`; ArtifactError naming `given` if not."""
    try:
        st = os.stat(resolved)
    except (FileNotFoundError, NotADirectoryError):
        raise ArtifactError(f"{shown(given)}: no such {'directory' if kind == 'dir' else 'file or directory'} "
                            "in the model roots") from None
    except OSError as e:
        raise ArtifactError(f"{shown(given)}: cannot be read ({e.strerror})") from None
    is_dir, is_file = stat.S_ISDIR(st.st_mode), stat.S_ISREG(st.st_mode)
    if (kind == "dir" and is_dir) or (kind == "file" and is_file) or (kind == "any" and (is_dir or is_file)):
        return
    what = "a directory" if is_dir else "a regular file" if is_file else "a FIFO, device or socket"
    raise ArtifactError(f"{shown(given)}: is {what}, not {_KIND_WORDS[kind]}")
