"""What tells a model's or an adapter's files apart from the ones read before: their names, sizes and modification
times (nothing is hashed: a checkpoint is gigabytes). A PATCH that finds the same fingerprint, path and figures
changes nothing; files replaced at the same path read as a new artifact, which its replicas roll onto."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path


def fingerprint(files: Iterable[Path]) -> str:
    """A digest of these files' names, sizes and modification times; "" when one cannot be read (then any read
    counts as a change)."""
    digest = hashlib.sha256()
    try:
        for path in sorted(Path(f) for f in files):
            stat = path.stat()
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    except OSError:
        return ""
    return digest.hexdigest()
