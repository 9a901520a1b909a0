"""Settings sanity as Django system checks: a bad scheduler setting stops `manage.py up` with its name."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, register

from console.scheduler import STRATEGIES


@register()
def scheduler_settings(app_configs, **kwargs) -> list[Error]:
    errors = []
    if settings.MODELGRID_STRATEGY not in STRATEGIES:
        errors.append(Error(f"MODELGRID_STRATEGY is {settings.MODELGRID_STRATEGY!r}",
                            hint=f"use one of {', '.join(STRATEGIES)}", id="modelgrid.E001"))
    durations = ("MODELGRID_QUIET_WINDOW_SECONDS", "MODELGRID_SCALE_COOLDOWN_SECONDS",
                 "MODELGRID_SEARCH_BUDGET_SECONDS")
    for name in durations:
        if getattr(settings, name) < 0:
            errors.append(Error(f"{name} is {getattr(settings, name)}", hint="use 0 or more seconds",
                                id="modelgrid.E002"))
    return errors
