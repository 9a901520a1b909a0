"""The alert chore: read what each enabled rule looks at, compare what fires with the alerts open, and open and
resolve alerts, each change told on the timeline and owed to the rule's webhook (console/alerts/webhooks.py)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F, Sum
from django.db.models.functions import Coalesce, Greatest

from console.accounts.scope import TeamScope
from console.alerts import rules
from console.alerts.models import Alert, AlertRule, RuleKind, WebhookDelivery
from console.deployments.models import Deployment
from console.events.models import Event
from console.events.record import Note, record
from console.fleet import lifecycle
from console.fleet.models import Gpu, Host
from console.fleet.presenters import float_sum
from console.scheduler.explain import seconds

FAILURES = ("Failed", "OutOfMemory", "HeartbeatTimeout")


def firing(rule: AlertRule, now: datetime) -> dict[str, str]:
    """What `rule` says fires now: {object: message}."""
    window = rule.window_s
    if rule.kind == RuleKind.SLO_VIOLATION:
        rows = Deployment.objects.filter(violating=True).values_list(
            "name", "violating", "status_since", "observed_p95_ms", "slo_latency_ms")
        return rules.slo_violations([rules.DeploymentSlo(*r) for r in rows], window, now)
    if rule.kind == RuleKind.REPLICA_FAILING:
        failures = dict(Event.objects.filter(reason__in=FAILURES, object__startswith="replica/",
                                             last_seen__gte=now - timedelta(seconds=window))
                        .values_list("object").annotate(n=Sum("count")))
        return rules.failing_replicas(failures, rule.threshold, window)
    if rule.kind == RuleKind.HOST_OFFLINE:
        rows = Host.objects.filter(connected=False).values_list("name", "unknown_since", "evicted_at")
        return rules.offline_hosts([rules.HostLife(n, lifecycle.state(False, unknown, ev), ev or unknown)
                                    for n, unknown, ev in rows], window, now)
    if rule.kind == RuleKind.FOREIGN_MEMORY:
        from console.series.store import read  # series depends on the fleet; alerts only read it

        since = now.timestamp() - window
        samples = {f"host/{name}": read(f"host/{name}", "foreign_bytes", since, now.timestamp())
                   for name in _foreign_above(rule.threshold)}
        return rules.growing_foreign(samples, rule.threshold, window)
    return {}


def _foreign_above(threshold: float) -> list[str]:
    """Connected hosts whose GPUs may hold more than `threshold` bytes of other processes' memory now: only their
    history is read (memory cannot have grown by more than is there), so a fleet without foreign use costs one
    query, not a series read per host. Where an agent does not say what it owns, all it uses counts."""
    used = (Gpu.objects.filter(host__connected=True).values("host__name")
            .annotate(foreign=float_sum(Greatest(F("used_bytes") - Coalesce("own_bytes", 0), 0))))
    return [row["host__name"] for row in used if (row["foreign"] or 0) > threshold]


def evaluate(now: datetime) -> int:
    """Open and resolve alerts for every enabled rule (a disabled rule's open alerts resolve); returns how many
    changed."""
    changed = 0
    for rule in AlertRule.in_force():
        now_firing = firing(rule, now) if rule.enabled else {}
        with transaction.atomic():
            changed += _settle(rule, now_firing, now)
    return changed


def _settle(rule: AlertRule, now_firing: dict[str, str], now: datetime) -> int:
    open_ = {a.object: a for a in Alert.objects.select_for_update().filter(rule=rule, resolved_at=None)}
    notes, opened, resolved = [], [], []
    for obj, message in now_firing.items():
        if obj not in open_:
            opened.append(Alert(rule=rule, object=obj, message=message, since=now))
            notes.append(_note(obj, "AlertFiring", f"{rule.kind}: {message}", warning=True))
    for obj, alert in open_.items():
        if obj not in now_firing:
            alert.resolved_at = now
            resolved.append(alert)
            notes.append(_note(obj, "AlertResolved", f"{rule.kind}: resolved after "
                               f"{seconds((now - alert.since).total_seconds())} ({alert.message})"))
    Alert.objects.bulk_create(opened)
    Alert.objects.bulk_update(resolved, ["resolved_at"])
    if rule.webhook_url:
        WebhookDelivery.objects.bulk_create(
            [WebhookDelivery(alert=a, url=rule.webhook_url, payload=payload(a, "firing"), next_attempt_at=now)
             for a in opened] +
            [WebhookDelivery(alert=a, url=rule.webhook_url, payload=payload(a, "resolved"), next_attempt_at=now)
             for a in resolved])
    record(notes, now)
    return len(opened) + len(resolved)


def payload(alert: Alert, status: str) -> dict:
    """What a webhook receives (Alertmanager-like, flat)."""
    return {"status": status, "alert": alert.rule.kind, "object": alert.object, "message": alert.message,
            "since": alert.since.isoformat(),
            "resolved_at": alert.resolved_at.isoformat() if alert.resolved_at else None}


def _note(obj: str, reason: str, message: str, warning: bool = False) -> Note:
    kind, _, name = obj.partition("/")
    deployment = name.rsplit("#", 1)[0] if kind in ("deployment", "replica") else ""
    return Note(obj, reason, message, warning=warning, actor="console alerts", deployment=deployment,
                host=name if kind == "host" else "")


def open_alerts(scope: TeamScope) -> list[Alert]:
    """The alerts firing now that `scope` may see (TeamScope.alerts: its deployments' and replicas', every host's)."""
    return scope.alerts(list(Alert.objects.filter(resolved_at=None).select_related("rule").order_by("-since")))
