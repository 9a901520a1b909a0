"""The host lifecycle applied (its rule: console/fleet/lifecycle.py): a scheduler pass lapses the leases of silent
hosts (they become unknown) and evicts hosts unknown for longer than the eviction timeout, oldest first, at most a
share of the fleet per minute (their replicas are then re-placed). Intake writes the other transitions as agents
speak: a renewed lease (connected again), a closed link (unknown)."""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta

from django.conf import settings

from console.bulk import update_in_key_order
from console.events.record import Note, host_object
from console.fleet import lifecycle
from console.fleet.models import Host

log = logging.getLogger("modelgrid.scheduler")


def lapse_leases(now: datetime, lease_s: float) -> list[str]:
    """Hosts whose agent said nothing for a lease become unknown (lifecycle.lapses_before); returns their names."""
    silent = Host.objects.filter(connected=True, last_seen__lt=lifecycle.lapses_before(now, lease_s))
    lapsed = dict(silent.values_list("pk", "name"))
    # The filter again: one that spoke up since the read keeps its lease (and is not named).
    if lapsed and update_in_key_order(silent.filter(pk__in=lapsed), connected=False, unknown_since=now) < len(lapsed):
        return list(Host.objects.filter(pk__in=lapsed, connected=False, unknown_since=now)
                    .values_list("name", flat=True))
    return list(lapsed.values())


def advance(now: datetime, notes: list[Note]) -> bool:
    """Lapse the leases due and evict the unknown hosts due, each told in `notes`; whether any host changed."""
    lease = settings.MODELGRID_HOST_LEASE_SECONDS
    lapsed = lapse_leases(now, lease)
    notes.extend(Note(host_object(name), "Unknown", f"no word from its agent for {lease:g} s: its lease lapsed; it "
                      "keeps its replicas but gets no new ones", warning=True, actor="console", host=name)
                 for name in lapsed)
    changed = bool(lapsed)
    eviction = settings.MODELGRID_EVICTION_SECONDS
    overdue = Host.objects.filter(lifecycle.where(lifecycle.UNKNOWN),
                                  unknown_since__lte=lifecycle.evicts_before(now, eviction))
    if not overdue.exists():
        return changed
    per_minute = max(1, math.ceil(settings.MODELGRID_EVICTION_RATE * Host.objects.count()))
    room = per_minute - Host.objects.filter(evicted_at__gte=now - timedelta(minutes=1)).count()
    if room <= 0:
        return changed
    chosen = list(overdue.order_by("unknown_since", "pk").values_list("pk", "name")[:room])
    update_in_key_order(Host.objects.filter(pk__in=[pk for pk, _ in chosen]), evicted_at=now)
    for _, name in chosen:
        log.warning("host %s: unknown for over %g s; its replicas are re-placed", name, eviction)
        notes.append(Note(host_object(name), "Evicted", f"unknown for over {eviction:g} s: its replicas are placed "
                          "elsewhere", warning=True, actor="console", host=name))
    return True
