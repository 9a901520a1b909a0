from datetime import datetime

from django.db import transaction
from ninja import Field, Router, Schema
from pydantic import ConfigDict

from console.accounts.auth import actor_of
from console.accounts.scope import TeamScope
from console.accounts.services import require_admin
from console.alerts.models import Alert, AlertRule, RuleKind
from console.alerts.targets import url_refusal
from console.catalog.schemas import ErrorOut, RequestBody
from console.errors import Invalid, NotFound
from console.events.record import Note, record

router = Router()
MAX_WINDOW_S = 30 * 86400


class AlertOut(Schema):
    rule: str = Field(description="the rule's kind")
    object: str
    message: str
    since: datetime
    resolved_at: datetime | None


class RuleOut(Schema):
    kind: str
    description: str
    enabled: bool
    window_s: int
    threshold: float
    webhook_url: str


class RulePatch(RequestBody):
    # Strict, as a deployment's policy is: `false` is not a threshold of 0, nor "5" a window.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    enabled: bool | None = None
    window_s: int | None = Field(None, ge=1, le=MAX_WINDOW_S, description="seconds")
    threshold: float | None = Field(None, ge=0, allow_inf_nan=False,
                                    description="failures (replica_failing) or bytes (foreign_memory_growing)")
    # No spaces and no control characters: neither belongs in a URL, and PostgreSQL refuses a NUL outright.
    webhook_url: str | None = Field(None, max_length=200, pattern=r"^(https?://[^\s\x00-\x1f\x7f]+)?$",
                                    description="an http(s) URL POSTed on firing and resolving; empty: none")


def _alert(a: Alert) -> dict:
    return {"rule": a.rule.kind, "object": a.object, "message": a.message, "since": a.since,
            "resolved_at": a.resolved_at}


def _rule(r: AlertRule) -> dict:
    return {"kind": r.kind, "description": r.get_kind_display(), "enabled": r.enabled, "window_s": r.window_s,
            "threshold": r.threshold, "webhook_url": r.webhook_url}


@router.get("", response={200: list[AlertOut], 422: ErrorOut},
            summary="Alerts firing now (with resolved=true, the last 100 resolved)")
def list_alerts(request, resolved: bool = False):
    rows = Alert.objects.select_related("rule")
    rows = rows.exclude(resolved_at=None).order_by("-resolved_at")[:100] if resolved else rows.filter(resolved_at=None)
    return [_alert(a) for a in TeamScope.of(request.user).alerts(list(rows))]


@router.get("/rules", response={200: list[RuleOut]}, summary="The alert rules: windows, thresholds, webhooks")
def list_rules(request):
    return [_rule(r) for r in AlertRule.in_force()]


@router.patch("/rules/{kind}", response={200: RuleOut, 403: ErrorOut, 404: ErrorOut, 422: ErrorOut},
              summary="Change an alert rule (told on the timeline)")
def update_rule(request, kind: str, body: RulePatch):
    require_admin(request.user, "change alert rules (they watch every team's deployments and hosts)")
    changes = body.dict(exclude_unset=True, exclude_none=True)
    refused = url_refusal(changes["webhook_url"]) if changes.get("webhook_url") else None
    if refused:
        raise Invalid(refused, "webhook_url")
    with transaction.atomic():
        if kind not in RuleKind.values:
            raise NotFound(f"no alert rule {kind!r}; the rules are {', '.join(RuleKind.values)}")
        AlertRule.in_force()  # a rule not stored yet is made from its default first
        rule = AlertRule.objects.select_for_update().get(kind=kind)
        said = [f"{f} {getattr(rule, f)!r} → {v!r}" for f, v in changes.items() if getattr(rule, f) != v]
        if said:
            for f, v in changes.items():
                setattr(rule, f, v)
            rule.save(update_fields=list(changes))
            record([Note(f"alert/{kind}", "AlertRuleChanged", "; ".join(said), actor=actor_of(request),
                         folds=False)])
    return _rule(rule)
