"""Writing the timeline: `record` appends events, folding repeats into the row they repeat (one row with a count,
as Kubernetes does, so a replica failing every minute is one line that counts, not a thousand); `prune` keeps it
within its retention and its row cap. Both are synchronous and run inside the caller's transaction, so an event
is committed exactly when the change it tells of is. Each event is stamped with the team that owns its object
(console/accounts/scope.py event_teams, which the events app hands to `owners_of` when the apps are ready: the
timeline imports none of the apps that write to it), which is what decides who reads it."""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from console.bulk import insert_values
from console.events.models import Event, EventType


def _not_ready(keys):
    raise RuntimeError("the timeline's owners are named when the apps are ready (console/events/apps.py)")


# The team owning each (object, deployment) a note names, or None: the team scope's to say, of every app's objects.
owners_of: Callable[[Iterable[tuple[str, str]]], dict[tuple[str, str], int | None]] = _not_ready

_CHUNK = 500  # objects per lookup of foldable rows: far below every backend's limit on query parameters
_COLUMNS = ("object", "deployment", "host", "team", "type", "reason", "message", "actor", "count", "first_seen",
            "last_seen")


@dataclass(frozen=True)
class Note:
    """An event to record. `deployment` and `host` name what it concerns besides its object."""

    object: str
    reason: str
    message: str
    warning: bool = False
    actor: str = ""
    deployment: str = ""
    host: str = ""
    # What a person or token did is told once each time: never folded (and no lookup of rows to fold into).
    folds: bool = True
    # The team owning its object, where the writer knows it better than a lookup by name can: an object it has just
    # deleted. None: looked up when recorded.
    team: int | None = None
    key: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.object, self._type, self.reason, self.message, self.actor))

    @property
    def _type(self) -> str:
        # The plain string: the bulk insert passes a str as it is, and prepares anything else (an enum member) through
        # its field.
        return (EventType.WARNING if self.warning else EventType.NORMAL).value


def deployment_object(name: str) -> str:
    return f"deployment/{name}"


def replica_object(deployment: str, index: int) -> str:
    return f"replica/{deployment}#{index}"


def host_object(name: str) -> str:
    return f"host/{name}"


def command_actor(command: str) -> str:
    """A management command as an actor: `manage.py COMMAND` and the account that ran it."""
    try:
        who = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        who = f"uid {os.getuid()}"
    return f"manage.py {command} ({who})"


def record(notes: Iterable[Note], now: datetime | None = None) -> int:
    """Append `notes` to the timeline, each folded into the same event seen within the fold window if there is
    one; returns how many rows were appended."""
    now = now or timezone.now()
    notes = list(notes)
    if not notes:
        return 0
    owners = owners_of((n.object, n.deployment) for n in notes if n.team is None)
    counts: dict[tuple, int] = {}
    first: dict[tuple, tuple[Note, int | None]] = {}
    for note in notes:
        # Its team is part of what it is: a name another team took since is another object.
        key = (*note.key, note.team if note.team is not None else owners[(note.object, note.deployment)])
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, (note, key[-1]))
    folded = _foldable([k for k, (n, _) in first.items() if n.folds],
                       now - timedelta(seconds=settings.MODELGRID_EVENTS_FOLD_SECONDS))
    for key, pk in sorted(folded.items(), key=lambda kv: kv[1]):  # in key order, as every writer takes them
        Event.objects.filter(pk=pk).update(count=F("count") + counts[key], last_seen=now)
    # Plain rows, no Event instance each: a pass that placed 8,000 replicas has as many events, and building the
    # instances was a fifth to a third of writing them (bench/create_cost.py), on the pass's thread.
    new = [(n.object, n.deployment, n.host, team, n._type, n.reason, n.message, n.actor, counts[k] if n.folds else 1,
            now, now) for k, (n, team) in first.items() if k not in folded for _ in range(1 if n.folds else counts[k])]
    insert_values(Event, _COLUMNS, new)
    return len(new)


def _foldable(keys: Iterable[tuple], since: datetime) -> dict[tuple, int]:
    """The newest event within the window per key (a note's, then its team): key -> its primary key."""
    wanted = set(keys)
    objects = sorted({k[0] for k in wanted})
    found: dict[tuple, int] = {}
    for i in range(0, len(objects), _CHUNK):
        rows = (Event.objects.filter(object__in=objects[i:i + _CHUNK], last_seen__gte=since)
                .values_list("pk", "object", "type", "reason", "message", "actor", "team").order_by("pk"))
        for pk, *key in rows:
            if tuple(key) in wanted:
                found[tuple(key)] = pk  # the newest wins: rows come oldest first
    return found


def prune(now: datetime | None = None) -> int:
    """Drop events older than the retention, then the oldest beyond the row cap; returns how many went."""
    now = now or timezone.now()
    kept_from = now - timedelta(days=settings.MODELGRID_EVENTS_RETENTION_DAYS)
    gone, _ = Event.objects.filter(last_seen__lt=kept_from).delete()
    cap = settings.MODELGRID_EVENTS_MAX_ROWS
    # The row at the cap, newest first: it and everything older goes (one indexed read, one delete).
    edge = Event.objects.order_by("-last_seen", "-id").values_list("last_seen", "id")[cap:cap + 1].first()
    if edge is not None:
        extra, _ = Event.objects.filter(last_seen__lte=edge[0]).exclude(last_seen=edge[0], id__gt=edge[1]).delete()
        gone += extra
    return gone
