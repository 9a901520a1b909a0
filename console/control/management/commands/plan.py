"""`python manage.py plan FILE.json`: run the scheduler on a described fleet (capacity planning, no database)."""

from __future__ import annotations

import json
import os
import sys

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from console.catalog.models import Calibration
from console.catalog.sizing import sized
from console.scheduler import STRATEGIES
from console.scheduler.dryrun import PlanInputError, plan_document
from console.scheduler.render import plan_to_json, plan_to_text


class Command(BaseCommand):
    help = "Plan the GPUs and deployments described in FILE.json (format: docs/placement.md) and print the plan."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="JSON document with gpus and deployments ('-' reads standard input)")
        parser.add_argument("--strategy", choices=STRATEGIES, default=None,
                            help="override the document's strategy (default: the document's, else memory-optimized)")
        parser.add_argument("--json", action="store_true", help="print the plan as JSON instead of tables")

    def handle(self, *args, **opts) -> None:
        try:
            text = sys.stdin.read() if opts["file"] == "-" else open(opts["file"], encoding="utf-8").read()
        except OSError as e:
            raise CommandError(f"{opts['file']}: cannot read ({e.strerror})", returncode=2) from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise CommandError(f"{opts['file']}: not valid JSON ({e.msg} at line {e.lineno})", returncode=2) from None
        try:
            # A model path typed in a shell is relative to the shell's directory; without the console's database
            # the estimates go uncalibrated.
            has_db = Calibration._meta.db_table in connection.introspection.table_names()
            result = plan_document(sized(doc, calibrate=has_db, relative_to=os.getcwd()), opts["strategy"])
        except PlanInputError as e:
            raise CommandError(f"{opts['file']}: {e}", returncode=2) from None
        self.stdout.write(json.dumps(plan_to_json(result), indent=2) if opts["json"] else plan_to_text(result))
