"""Time series of what the fleet did, stored change-only (see console/series/store.py for why)."""

from __future__ import annotations

from django.db import models


class Series(models.Model):
    """One metric of one object, with the state the sampler needs to write only changes: the value in force
    (since its last fine point), what the current 5-minute window has accumulated before that value, and
    the value of its last 5-minute point."""

    kind = models.CharField(max_length=10)  # deployment | host | fleet
    object_id = models.BigIntegerField(help_text="the deployment's or host's primary key; 0 for the fleet")
    metric = models.CharField(max_length=24)
    value = models.FloatField(null=True, help_text="in force since `since`; null: no reading")
    since = models.BigIntegerField(help_text="unix seconds of its last fine point")
    first = models.BigIntegerField(help_text="unix seconds of its first point: before it, it has no value")
    # The time-weighted sum of earlier values within window `acc_window` (unix seconds // 300), and the
    # seconds that had a value: the 5-minute mean without a write per tick.
    acc_window = models.BigIntegerField(default=0)
    acc_sum = models.FloatField(default=0.0)
    acc_seconds = models.FloatField(default=0.0)
    coarse_value = models.FloatField(null=True)
    coarse_since = models.BigIntegerField(null=True, help_text="window start of its last 5-minute point")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "object_id", "metric"], name="series_unique_metric")]

    def __str__(self) -> str:
        return f"{self.kind}/{self.object_id} {self.metric}"


class Point(models.Model):
    """A value that holds from `t` until the series' next point (a step function): 10-second points where
    the sampled value changed, 5-minute points (coarse) where the window's mean changed."""

    # No foreign-key index of its own: the composite index below starts with the series.
    series = models.ForeignKey(Series, on_delete=models.CASCADE, related_name="+", db_index=False)
    coarse = models.BooleanField(default=False)
    t = models.BigIntegerField(help_text="unix seconds (a 5-minute point: its window's start)")
    value = models.FloatField(null=True)

    class Meta:
        indexes = [
            models.Index(fields=["series", "coarse", "t"], name="point_series_time"),
            models.Index(fields=["coarse", "t"], name="point_age"),  # pruning by age
        ]

    def __str__(self) -> str:
        return f"{self.series_id}@{self.t}={self.value}"


class Clock(models.Model):
    """The sampler's last tick (one row): where readers stop filling forward, and how outages are noticed."""

    last_tick = models.BigIntegerField(null=True)

    def __str__(self) -> str:
        return f"last tick {self.last_tick}"


class Outage(models.Model):
    """A stretch with no sampler ticks (no scheduler leader): readers break lines there instead of
    carrying the last value across it."""

    start = models.BigIntegerField(help_text="the last tick before it")
    end = models.BigIntegerField(db_index=True, help_text="the first tick after it")

    def __str__(self) -> str:
        return f"no samples {self.start}–{self.end}"
