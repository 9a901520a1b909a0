"""Typed readers for settings from environment variables; a bad value fails loudly."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured


def envstr(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def envbool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use true/false)")


def envint(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None


def envfloat(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number") from None


def envsecret(name: str) -> str:
    """A secret from NAME, or from the file named by NAME_FILE (a mounted Kubernetes or compose secret), so it need
    be in neither the environment nor a command line. Both set, or a file that cannot be read, fails loudly."""
    file_name = os.environ.get(f"{name}_FILE")
    if not file_name:
        return os.environ.get(name, "")
    if os.environ.get(name):
        raise ImproperlyConfigured(f"set {name} or {name}_FILE, not both")
    try:
        with open(file_name, encoding="utf-8") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ImproperlyConfigured(f"{name}_FILE={file_name!r} cannot be read: {e}") from None
