"""The agent's token from a file (`--token-file`, MODELGRID_AGENT_TOKEN_FILE): a Kubernetes Secret or a compose
secret mounted into the container, so the token is in neither the environment nor the command line.

Read once at start. Refused, each with a message that says what to change: a missing or unreadable file, anything
but a regular file (a FIFO would hang the start), a file that every user of the host may read (mode o+r: the token
would not be the agent's alone), an empty one, or one that holds more than one word.
"""

from __future__ import annotations

import os
import stat

MAX_BYTES = 4096  # a token is 60-odd characters; anything this long is the wrong file


class TokenFileError(ValueError):
    """The token file cannot be used; the message names it and says why."""


def read_token_file(path: str) -> str:
    """The token in `path`, surrounding whitespace stripped."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise TokenFileError(f"token file {path}: no such file") from None
    except OSError as e:
        raise TokenFileError(f"token file {path}: cannot open it ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise TokenFileError(f"token file {path}: not a regular file")
        if mode & (stat.S_IROTH | stat.S_IWOTH):
            raise TokenFileError(
                f"token file {path}: every user may read or write it (mode {stat.S_IMODE(mode):04o}); make it "
                "readable by the agent's user or group only (chmod 600 or 640; in Kubernetes, defaultMode: 0440 "
                "with the pod's fsGroup)")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise TokenFileError(f"token file {path}: longer than {MAX_BYTES} bytes; it holds no agent token")
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TokenFileError(f"token file {path}: not ASCII text; it holds no agent token") from None
    if not token:
        raise TokenFileError(f"token file {path}: empty; write the token into it (an agent's: what "
                             "`manage.py createagenttoken HOST` printed)")
    if len(token.split()) != 1:
        raise TokenFileError(f"token file {path}: more than one word; it must hold the agent token alone")
    return token
