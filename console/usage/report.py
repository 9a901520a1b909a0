"""Reading usage: totals and a series per team, token or deployment over a range, in steps, narrowed to the reader's
team scope (console/accounts/scope.py). Minute and hour buckets are read together: rolling moves a
minute's counts into its hour, so the two never count the same request."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from django.db.models import Q, Sum

from console.accounts.models import ApiToken, Team
from console.accounts.scope import TeamScope
from console.catalog.names import is_name
from console.errors import Invalid
from console.usage.models import UsageHour, UsageMinute
from console.usage.store import COUNTS

GROUPS = ("team", "token", "deployment")
MAX_POINTS = 1500  # a series' steps at most: (until - since) / step


@dataclass
class Counts:
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    queue_seconds: float = 0.0

    def add(self, values) -> None:
        self.requests += values[0] or 0
        self.errors += values[1] or 0
        self.prompt_tokens += values[2] or 0
        self.completion_tokens += values[3] or 0
        self.queue_seconds += values[4] or 0.0

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"queue_seconds": round(self.queue_seconds, 6)}


@dataclass
class Group:
    key: str  # the team's or deployment's name, or the token's prefix
    label: str  # for people: a token's name, prefix and user
    totals: Counts = field(default_factory=Counts)
    series: list[Counts] = field(default_factory=list)  # one per step from `since`


@dataclass
class Report:
    group: str
    since: int
    until: int
    step: int
    totals: Counts
    groups: list[Group]

    @property
    def times(self) -> list[int]:
        return list(range(self.since, self.until, self.step))


def refused(name: str, message: str) -> Invalid:
    return Invalid("", errors=[{"loc": ["query", name], "type": "invalid", "msg": message}])


def check_range(since: int, until: int, step: int) -> None:
    """Refuse a range that is empty or has too many steps, naming the parameter to change."""
    if step < 60 or step % 60:
        raise refused("step", f"step must be a whole number of minutes in seconds (60, 300, 3600, ...), got {step}")
    if until <= since:
        raise refused("until", "until must be after since")
    if (until - since) / step > MAX_POINTS:
        raise refused("step", f"from since to until is {(until - since) // step:,} steps of {step} s; at most "
                      f"{MAX_POINTS:,}: take a longer step or a shorter range")


def report(scope: TeamScope, group: str, since: int, until: int, step: int, team: str | None = None,
           deployment: str | None = None) -> Report:
    """Usage in [since, until) by `group`, in steps of `step` seconds (since aligned down to a minute)."""
    if group not in GROUPS:
        raise refused("group", f"group must be one of {', '.join(GROUPS)}, got {group[:40]!r}")
    since -= since % 60
    check_range(since, until, step)
    where = Q(at__gte=since, at__lt=until)
    if team:
        where &= Q(team_id=_team_id(scope, team))
    if deployment:
        if not is_name(deployment):  # (a NUL, say, which PostgreSQL refuses outright in a query)
            raise refused("deployment", f"{deployment[:63]!r} is not a deployment's name")
        where &= Q(deployment=deployment)
    column = {"team": "team_id", "token": "token_id", "deployment": "deployment"}[group]
    steps = len(range(since, until, step))
    keyed: dict[object, list[Counts]] = {}
    totals = Counts()
    for model in (UsageMinute, UsageHour):
        rows = (scope.usage(model.objects.filter(where)).order_by().values_list(column, "at")
                .annotate(*(Sum(c) for c in COUNTS)))
        for key, at, *values in rows:
            series = keyed.setdefault(key, [Counts() for _ in range(steps)])
            series[(at - since) // step].add(values)
            totals.add(values)
    names = _names(group, keyed)
    groups = []
    for key, series in keyed.items():
        g = Group(*names.get(key, ("", "(deleted)")), series=series)
        for point in series:
            g.totals.add([getattr(point, c) for c in COUNTS])
        groups.append(g)
    groups.sort(key=lambda g: (-g.totals.requests, g.label))
    return Report(group, since, until, step, totals, groups)


def _team_id(scope: TeamScope, name: str) -> int:
    """The id of the team named `name` in `scope`; one missing or not the reader's is refused alike, naming the
    `team` parameter."""
    found = Team.objects.filter(name=name).values_list("pk", flat=True).first() if is_name(name) else None
    if found is None or not scope.owns(found):
        raise refused("team", f"no team named {name[:63]!r}; GET /api/v1/teams lists yours")
    return found


def _names(group: str, keys) -> dict:
    """Each group key's (key, label): a team's name, a deployment's name, a token's prefix and its name."""
    if group == "deployment":
        return {k: (k, k) for k in keys}
    if group == "team":
        return {pk: (name, name) for pk, name in Team.objects.filter(pk__in=[k for k in keys if k])
                .values_list("pk", "name")}
    return {t.pk: (t.prefix, token_label(t.name, t.prefix, t.user.get_username()))
            for t in ApiToken.objects.filter(pk__in=[k for k in keys if k]).select_related("user")}


def token_label(name: str, prefix: str, user: str) -> str:
    """A token as people know it: never its secret."""
    return f"{user} / {name} ({prefix}…)"
