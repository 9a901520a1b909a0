#!/usr/bin/env python
import os
import sys


def _data_dir_from_argv(argv: list[str]) -> str | None:
    # `--data-dir` picks the database the settings open, so it must be known before Django starts.
    for i, arg in enumerate(argv):
        if arg == "--data-dir" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--data-dir="):
            return arg.split("=", 1)[1]
    return None


if __name__ == "__main__":
    if data_dir := _data_dir_from_argv(sys.argv):
        os.environ["MODELGRID_DATA_DIR"] = os.path.abspath(data_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
