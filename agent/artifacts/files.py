"""Looking at and opening artifact files without trusting them.

Every reader goes through here so that:
* a FIFO, device or socket named like a model file is refused instead of blocking the request
  (files are opened O_NONBLOCK, then fstat'ed, and only regular files are read);
* JSON files are read up to MAX_JSON_BYTES and parsed by strict_json;
* any OSError while looking at a path (ENAMETOOLONG, EACCES, ELOOP, ...) is an ArtifactError;
* with model roots given, a file whose real path (symlinks resolved) is outside them is refused
  with the same message whether or not its target exists.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Literal

from agent.artifacts import strict_json
from agent.artifacts.errors import ArtifactError
from agent.artifacts.limits import MAX_JSON_BYTES
from agent.artifacts.roots import OUTSIDE_ROOTS, OutsideModelRoots, inside, real_roots

Roots = Sequence[str | os.PathLike] | None
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def kind_of(path: Path, roots: Roots = None) -> Literal["dir", "file", "missing", "other"]:
    """What is at `path` (symlinks followed): a directory, a regular file, nothing, or something else.

    With `roots`, a path resolving outside them raises OutsideModelRoots first, whether or not its
    target exists, so "missing" never tells anything about the world outside the roots.
    """
    if roots is not None:
        real_path(path, roots)
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError as e:
        raise ArtifactError(f"{path}: cannot be read ({e.strerror})") from None
    except ValueError:  # an embedded NUL byte
        raise ArtifactError(f"{path!r}: not a valid path (it contains a NUL character)") from None
    return "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"


def list_dir(path: Path, suffix: str) -> list[Path]:
    """Entries of directory `path` whose names end with `suffix`, sorted; ArtifactError if unreadable."""
    try:
        with os.scandir(path) as entries:
            return sorted(path / e.name for e in entries if e.name.endswith(suffix))
    except OSError as e:
        raise ArtifactError(f"{path}: cannot be listed ({e.strerror})") from None


def real_path(path: Path, roots: Roots) -> Path:
    """`path` with symlinks resolved; with `roots`, OutsideModelRoots when it resolves outside them."""
    if "\0" in str(path):
        raise ArtifactError(f"{path!r}: not a valid path (it contains a NUL character)")
    resolved = os.path.realpath(path)
    if roots is not None and not inside(resolved, real_roots(roots)):
        raise OutsideModelRoots(f"{path}: {OUTSIDE_ROOTS}")
    return Path(resolved)


@contextmanager
def open_regular(path: Path, roots: Roots = None) -> Iterator[tuple[BinaryIO, int]]:
    """Open `path` for reading if it is a regular file (inside `roots` when given); yields (file, size)."""
    target = real_path(path, roots) if roots is not None else path
    flags = _OPEN_FLAGS | (os.O_NOFOLLOW if roots is not None else 0)  # the resolved path has no links left
    try:
        fd = os.open(target, flags)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such file") from None
    except OSError as e:  # ENXIO: a socket; ELOOP: a link swapped in after resolving; ENAMETOOLONG; EACCES
        raise ArtifactError(f"{path}: cannot be opened ({e.strerror})") from None
    except ValueError:
        raise ArtifactError(f"{path!r}: not a valid path (it contains a NUL character)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO, device or socket"
            raise ArtifactError(f"{path}: is {what}, not a regular file (only regular files are read)")
        if roots is not None:
            _check_opened(fd, path, roots)
        os.set_blocking(fd, True)  # a regular file: plain blocking reads from here on
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        try:
            yield f, st.st_size
        except OSError as e:
            raise ArtifactError(f"{path}: cannot be read ({e.strerror})") from None


def _check_opened(fd: int, path: Path, roots: Sequence[str | os.PathLike]) -> None:
    """Re-check the file actually opened (Linux names it in /proc), closing the race with a swapped directory."""
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return  # no /proc: the resolved path was already checked
    if not inside(opened, real_roots(roots)):
        raise OutsideModelRoots(f"{path}: {OUTSIDE_ROOTS}")


def read_bytes(path: Path, limit: int, roots: Roots = None) -> bytes:
    """All of regular file `path`, refused when larger than `limit` bytes."""
    with open_regular(path, roots) as (f, size):
        if size > limit:
            raise ArtifactError(f"{path}: is {size:,} bytes; at most {limit:,} are read from this kind of file")
        data = f.read(limit + 1)
    if len(data) > limit:  # grew while being read
        raise ArtifactError(f"{path}: is larger than {limit:,} bytes, the most read from this kind of file")
    return data


def read_json(path: Path, roots: Roots = None) -> Any:
    """Parse JSON file `path` (at most MAX_JSON_BYTES) with the strict parser."""
    return strict_json.loads(read_bytes(path, MAX_JSON_BYTES, roots), str(path))
