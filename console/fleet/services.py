"""Changes an operator makes to the fleet: a host's labels (what its GPUs carry for selectors) and taints (which keep
them for deployments that tolerate them), both the console's to own; and the placement strategy, at run time."""

from __future__ import annotations

from typing import Annotated

from django.db import transaction
from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticError

from console.accounts.services import require_admin
from console.changes import wake_scheduler
from console.deployments.policy import MAX_SELECTOR_LABELS, Label, invalid_from
from console.errors import Invalid, NotFound
from console.fleet.models import Host, PlacementSettings

Labels = Annotated[dict[Label, Label], Field(max_length=MAX_SELECTOR_LABELS)]


class HostPlacement(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    labels: Labels | None = Field(None, description="labels of all its GPUs, e.g. {\"zone\": \"east\"}; the `zone` "
                                  "label is what spread keeps replicas apart across")
    taints: Labels | None = Field(None, description="e.g. {\"pool\": \"ml\"}: only deployments that tolerate every "
                                  "taint are placed on its GPUs (they keep their replicas there already)")


def set_placement(requester, name: str, changes: dict, actor: str = "") -> Host:
    """Replace a host's labels and/or taints (those given); a refusal (Forbidden unless `requester` is an admin,
    NotFound, Invalid naming the field) stores nothing. The scheduler's next pass plans with them: replicas on GPUs a
    taint no longer admits are re-placed."""
    require_admin(requester, "set a host's labels and taints (every team's deployments are placed by them)")
    from console.events.record import Note, host_object, record

    try:
        chosen = HostPlacement.model_validate(changes)
    except PydanticError as e:
        raise invalid_from(e) from None
    with transaction.atomic():
        host = Host.named(name).select_for_update().first()
        if host is None:
            raise NotFound(f"no host named {name!r}")
        changed = {f: v for f, v in chosen.model_dump(exclude_none=True).items() if getattr(host, f) != v}
        if not changed:
            return host
        words = []
        for field, value in changed.items():
            words.append(f"{field} {_text(getattr(host, field))} → {_text(value)}")
            setattr(host, field, value)
        host.save(update_fields=list(changed))
        record([Note(host_object(name), "HostPlacementChanged", "; ".join(words), actor=actor, host=name,
                     folds=False)])
        transaction.on_commit(wake_scheduler)
    return host


def _text(pairs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in pairs.items()) or "none"


def set_strategy(requester, strategy: str, actor: str = "") -> str:
    """Plan with `strategy` from the scheduler's next pass on (Forbidden unless `requester` is an admin; Invalid
    naming the choices otherwise)."""
    require_admin(requester, "change the placement strategy (it places every team's deployments)")
    from console.events.record import Note, record
    from console.scheduler import STRATEGIES

    if strategy not in STRATEGIES:
        raise Invalid(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}", field="strategy")
    with transaction.atomic():
        before, _ = PlacementSettings.strategy_now()
        PlacementSettings.objects.update_or_create(pk=1, defaults={"strategy": strategy})
        if before != strategy:
            record([Note("scheduler", "StrategyChanged", f"placement strategy {before} → {strategy}", actor=actor,
                         folds=False)])
            transaction.on_commit(wake_scheduler)
    return strategy
