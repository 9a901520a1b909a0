"""`python manage.py estimate PATH`: the estimator's breakdown plus the calibration measured loads give."""

from __future__ import annotations

import json
import os

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from agent.artifacts import Estimate
from agent.artifacts.report import format_estimate
from console.catalog.models import Calibration
from console.catalog.services import estimate_request
from console.errors import DomainError


class Command(BaseCommand):
    help = "Memory one replica needs (weights, KV cache, activations, overhead), calibrated by measured loads."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="a model directory, config-only directory, config.json or .safetensors file")
        parser.add_argument("--dtype", default=None, help="serving dtype: float32, float16, bfloat16 (default: stored)")
        parser.add_argument("--batch", default=1, type=int, help="concurrent sequences (default 1)")
        parser.add_argument("--seq", default=None, type=int,
                            help="tokens per sequence, the image side for vision models "
                            "(default min(max positions, 2048))")
        parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="device kind (default cuda)")
        parser.add_argument("--json", action="store_true", help="print the JSON breakdown instead of a table")

    def handle(self, *args, **opts) -> None:
        # Usable before the console's database exists: the estimate then goes without calibration.
        has_db = Calibration._meta.db_table in connection.introspection.table_names()
        try:
            # A path typed in a shell is relative to the shell's directory (the API's are relative to the first root).
            result = estimate_request(os.path.abspath(opts["path"]), None, opts["dtype"], opts["batch"], opts["seq"],
                                      opts["device"], calibrate=has_db)
        except DomainError as e:
            raise CommandError(str(e), returncode=2) from None
        if opts["json"]:
            self.stdout.write(json.dumps(result, indent=2))
            return
        calibration = {k: result.pop(k) for k in ("calibrated_bytes", "calibration_factor", "calibrated_from")}
        est = Estimate(**(result | {"notes": tuple(result["notes"])}))
        if calibration["calibrated_from"]:
            line = (f"calibrated   {calibration['calibrated_bytes']:>16,} B  "
                    f"{calibration['calibrated_bytes'] / 2**20:>12,.1f} MiB  (x{calibration['calibration_factor']:.3f} "
                    f"from {calibration['calibrated_from']} measured {est.family} loads on {est.device})")
        elif has_db:
            line = f"uncalibrated: no measured {est.family} loads on {est.device} yet"
        else:
            line = "uncalibrated: the console database is not set up (manage.py migrate, or run up once)"
        self.stdout.write(format_estimate(est, extra=(line,)))
