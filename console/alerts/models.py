from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models


class RuleKind(models.TextChoices):
    SLO_VIOLATION = "slo_violation", "a deployment violates its SLO for longer than the window"
    REPLICA_FAILING = "replica_failing", "a replica failed at least `threshold` times within the window"
    HOST_OFFLINE = "host_offline", "a host has been unknown or offline for longer than the window"
    FOREIGN_MEMORY = "foreign_memory_growing", ("memory used by processes ModelGrid does not own grew by more than "
                                                "`threshold` bytes on a host within the window")


class AlertRule(models.Model):
    """One kind of alert, its window and threshold, and where to tell (an optional webhook)."""

    kind = models.CharField(max_length=30, choices=RuleKind.choices, unique=True)
    enabled = models.BooleanField(default=True)
    window_s = models.PositiveIntegerField(help_text="how long the condition must hold, or the span looked at")
    threshold = models.FloatField(default=0, help_text="failures (replica_failing) or bytes (foreign_memory_growing)")
    webhook_url = models.URLField(blank=True, help_text="POSTed a JSON body when an alert fires or resolves")

    class Meta:
        ordering = ["kind"]

    def __str__(self) -> str:
        return self.kind

    def clean(self) -> None:
        # The admin's form; the API checks the same before it saves.
        from console.alerts.targets import url_refusal

        refused = url_refusal(self.webhook_url) if self.webhook_url else None
        if refused:
            raise ValidationError({"webhook_url": refused})

    @classmethod
    def in_force(cls) -> list[AlertRule]:
        """Every rule, each missing one made from its default (a new console, or a rule deleted in the admin)."""
        rules = {r.kind: r for r in cls.objects.all()}
        for kind, (window_s, threshold) in DEFAULTS.items():
            if kind not in rules:
                rules[kind], _ = cls.objects.get_or_create(kind=kind, defaults={"window_s": window_s,
                                                                                 "threshold": threshold})
        return sorted(rules.values(), key=lambda r: r.kind)


# Each rule's window (seconds) and threshold until an operator changes them.
DEFAULTS = {
    RuleKind.SLO_VIOLATION: (300, 0),
    RuleKind.REPLICA_FAILING: (900, 3),
    RuleKind.HOST_OFFLINE: (60, 0),
    RuleKind.FOREIGN_MEMORY: (600, 1 << 30),
}


class Alert(models.Model):
    """A rule firing for one object (deployment/NAME, replica/NAME#I, host/NAME), from `since` until resolved."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="alerts")
    object = models.CharField(max_length=300)
    message = models.TextField()
    since = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-since", "-id"]
        constraints = [models.UniqueConstraint(fields=["rule", "object"], condition=models.Q(resolved_at=None),
                                               name="alert_one_active_per_object")]

    def __str__(self) -> str:
        return f"{self.rule.kind} {self.object}"


class WebhookDelivery(models.Model):
    """One POST owed to a rule's webhook (an outbox: it survives restarts and leader changes), retried with
    backoff until delivered or given up."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    url = models.URLField()
    payload = models.JSONField()
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    given_up_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        indexes = [models.Index(fields=["delivered_at", "given_up_at", "next_attempt_at"], name="delivery_due")]

    def __str__(self) -> str:
        return f"{self.payload.get('status', '?')} {self.alert} to {self.url}"
