"""The one rule for host names, for the agent (`--name`) and the console (tokens, hellos, the admin) alike.

A host's name is given by its machine (`socket.gethostname()`, an FQDN) rather than chosen for a URL, so it is not
held to the catalog's name rule (console/catalog/names.py: lowercase, 63 characters): it is an RFC 1123 host name,
dot-separated labels of ASCII letters (either case) and digits with inner `-` (and `_`, which some machines' names
hold), each starting and ending with a letter or digit. Nothing else gets in: no letter of another script that
looks like an ASCII one (a Cyrillic `а` in `gpu-а` would pass for `gpu-a` in every list), and no `/`, `?`, `#`,
space or control character (names end up in URL paths and page titles).
"""

from __future__ import annotations

import argparse
import re
import unicodedata

MAX_HOST_NAME = 200  # Host.name and AgentCredential.host_name (RFC 1123 allows 253; the columns hold 200)
MAX_LABEL = 63
WORDS = ("use ASCII letters, digits, '-' and '_' in dot-separated labels of 1-63 characters, each starting and "
         f"ending with a letter or digit, {MAX_HOST_NAME} characters in all")
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?")
_ALLOWED = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")
_IN_URLS = {"/": "a path separator", "?": "a URL's query mark", "#": "a URL's fragment mark"}


def host_name_problem(name: object) -> str | None:
    """What is wrong with `name` as a host name, in words a person can act on; None when nothing is."""
    if not isinstance(name, str):
        return f"is not a string; {WORDS}"
    if not name:
        return f"is empty; {WORDS}"
    if len(name) > MAX_HOST_NAME:
        return f"is {len(name)} characters long, above {MAX_HOST_NAME}"
    bad = next((i for i, c in enumerate(name) if c not in _ALLOWED), None)
    if bad is not None:
        return f"has {_described(name[bad])} at position {bad}; {WORDS}"
    for label in name.split("."):
        if not label:
            return f"has an empty label (a leading, trailing or doubled '.'); {WORDS}"
        if len(label) > MAX_LABEL:
            return f"has a label of {len(label)} characters ({label[:20]}…), above {MAX_LABEL}"
        if _LABEL.fullmatch(label) is None:
            return f"has the label {label!r}, which does not start and end with a letter or digit; {WORDS}"
    return None


def host_name_refusal(name: object) -> str | None:
    """"host name 'x' is not valid: it ..." for a name the rule refuses (its start, if long); None for a good one."""
    problem = host_name_problem(name)
    if problem is None:
        return None
    shown = name[:60] + "…" if isinstance(name, str) and len(name) > 60 else name
    return f"host name {shown!r} is not valid: it {problem}"


def host_name_argument(text: str) -> str:
    """`text` as a command line's host name (the agent's --name, up's --agent-name); argparse's error otherwise."""
    refusal = host_name_refusal(text)
    if refusal is not None:
        raise argparse.ArgumentTypeError(refusal)
    return text


def is_host_name(name: object) -> bool:
    """Whether `name` is a well-formed host name."""
    return host_name_problem(name) is None


def _described(c: str) -> str:
    if c in _IN_URLS:
        return f"{c!r} ({_IN_URLS[c]}: host names end up in URLs and page titles)"
    if c.isspace() or not c.isprintable():
        return f"{c!r} (a space or control character)"
    if ord(c) > 127:
        # Name the letter, so that one of another script that looks like an ASCII one is seen for what it is.
        return f"{c!r} ({unicodedata.name(c, 'a character')}, U+{ord(c):04X}: host names are ASCII)"
    return repr(c)
