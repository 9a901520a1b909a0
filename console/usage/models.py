"""Usage as counters per bucket of time, team, token and deployment: minute buckets for a few days, rolled into
hour buckets kept long (console/usage/store.py), and totals for all time, never pruned (what /metrics exports).
Each row is only ever added to, so several console processes writing the same bucket add up."""

from __future__ import annotations

from django.db import models

from console.accounts.models import ApiToken, Team


class UsageCounts(models.Model):
    # Nullable, so a deleted team or token leaves its usage behind; the gateway always names both.
    team = models.ForeignKey(Team, null=True, on_delete=models.SET_NULL, related_name="+")
    token = models.ForeignKey(ApiToken, null=True, on_delete=models.SET_NULL, related_name="+")
    deployment = models.CharField(max_length=63, help_text="by name: a deleted deployment's usage stays")
    requests = models.BigIntegerField(default=0)
    errors = models.BigIntegerField(default=0, help_text="answers with status >= 400")
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    queue_seconds = models.FloatField(default=0.0, help_text="the sum of the requests' waits for a ready replica")

    class Meta:
        abstract = True


class UsageBucket(UsageCounts):
    at = models.BigIntegerField(help_text="the bucket's start, unix seconds (UTC)")

    class Meta:
        abstract = True


class UsageTotal(UsageCounts):
    """Everything since the first request, per team, token and deployment: /metrics' counters, which must only grow
    (pruning old hours would read as a counter reset) and be read without summing months of buckets."""

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "token", "deployment"], name="usage_total_key")]

    def __str__(self) -> str:
        return f"{self.deployment}: {self.requests} requests in all"


class UsageMinute(UsageBucket):
    class Meta:
        constraints = [models.UniqueConstraint(fields=["at", "team", "token", "deployment"],
                                               name="usage_minute_key")]
        indexes = [models.Index(fields=["at"], name="usage_minute_at")]

    def __str__(self) -> str:
        return f"{self.deployment} minute {self.at}: {self.requests} requests"


class UsageHour(UsageBucket):
    class Meta:
        constraints = [models.UniqueConstraint(fields=["at", "team", "token", "deployment"],
                                               name="usage_hour_key")]
        indexes = [models.Index(fields=["at"], name="usage_hour_at")]

    def __str__(self) -> str:
        return f"{self.deployment} hour {self.at}: {self.requests} requests"
