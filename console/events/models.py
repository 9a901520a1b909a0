from __future__ import annotations

from django.db import models


class EventType(models.TextChoices):
    NORMAL = "Normal"
    WARNING = "Warning"


class Event(models.Model):
    """One entry of the timeline, Kubernetes-style: what happened to which object and why. The same event again
    within the fold window is folded into its row (count, last_seen) instead of appended."""

    # "deployment/NAME", "replica/NAME#INDEX", "host/NAME", "model/NAME", "adapter/NAME", "token/USER/NAME"
    object = models.CharField(max_length=300)
    # The deployment and the host it concerns (a replica's event concerns both), so that a deployment's or a
    # host's page shows its replicas' events too. Names, not keys: the timeline outlives what it names.
    deployment = models.CharField(max_length=63, blank=True)
    host = models.CharField(max_length=200, blank=True)
    # The team that owned its object when it was recorded (console/accounts/scope.py event_teams): who reads it.
    # A plain number, not a key: the timeline outlives teams too. Null: no team's (hosts, the strategy, tokens).
    team = models.IntegerField(null=True, blank=True)
    type = models.CharField(max_length=7, choices=EventType.choices, default=EventType.NORMAL)
    reason = models.CharField(max_length=40, help_text="a CamelCase code: Placed, Preempted, Failed, ...")
    message = models.TextField()
    actor = models.CharField(max_length=200, blank=True, help_text="who did it: scheduler, agent, a user or token")
    count = models.PositiveIntegerField(default=1)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()

    class Meta:
        ordering = ["-last_seen", "-id"]
        indexes = [
            models.Index(fields=["-last_seen", "-id"], name="event_timeline"),
            models.Index(fields=["deployment", "-last_seen", "-id"], name="event_by_deployment"),
            models.Index(fields=["host", "-last_seen", "-id"], name="event_by_host"),
            models.Index(fields=["object", "-last_seen", "-id"], name="event_by_object"),
        ]

    def __str__(self) -> str:
        return f"{self.object} {self.reason}: {self.message}"
