"""Team scope: the one owner of what a person sees across the team boundary. Every page, API list, live update,
event query, series, chart, calibration sample, usage report and alert list narrows what it shows through a
`TeamScope`; nothing else filters by team.

What a scope holds: a member acts within their teams and sees those teams' models, deployments, adapters, routes,
replicas, events, series, samples, usage and alerts; hosts, GPUs and what is about them alone (their memory, their
own events, the scheduler's strategy) are shared by every team. Another team's object reads as if it did not
exist, except a replica on a shared GPU, whose memory shows without its name (`replica`). Admins (staff and
superusers) act within ALL teams. Membership is read when a scope is made (`TeamScope.of`): a page, an API call
and a live update each make theirs, so a change of membership shows at the next one.

The timeline outlives what it names, so each event carries the team that owned its object when it was recorded
(`event_teams`, called by console/events/record.py): a deleted deployment's events stay its team's, and a name
taken again by another team does not hand over the old owner's history."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db.models import Case, Q, QuerySet, Value, When
from django.db.models.functions import Greatest, StrIndex, Substr

Teams = frozenset[int] | None  # the teams one acts within; None: all of them (admins)
ALL: Teams = None

OTHER_TEAM = "another team"  # how a replica of a deployment the viewer may not see is named
# Timeline objects every team shares: hosts, the placement strategy, the alert rules.
FLEET_OBJECTS = Q(object__startswith="host/") | Q(object="scheduler") | Q(object__startswith="alert/")
_CHUNK = 500  # names per lookup: far below every backend's limit on query parameters


def is_admin(user) -> bool:
    """Staff and superusers act across teams."""
    return bool(user.is_active and (user.is_staff or user.is_superuser))


def teams_of(user) -> Teams:
    """The teams `user` acts within: their memberships, or ALL for admins."""
    if is_admin(user):
        return ALL
    if not user.is_authenticated:
        return frozenset()
    return frozenset(user.teams.values_list("pk", flat=True))


def scoped(rows: QuerySet, teams: Teams) -> QuerySet:
    """`rows` (of a model with a `team`) narrowed to `teams`: what list, get, change and delete may touch."""
    return rows if teams is None else rows.filter(team_id__in=teams)


@dataclass(frozen=True)
class TeamScope:
    """The teams one acts within (ALL: every team's, for admins), and how each kind of row narrows to them."""

    teams: Teams = ALL

    @classmethod
    def of(cls, user) -> TeamScope:
        """The scope of `user` now: their memberships, read from the database (ALL for admins)."""
        return cls(teams_of(user))

    @property
    def everything(self) -> bool:
        """Whether every team's objects are in scope (an admin's)."""
        return self.teams is None

    def owns(self, team_id: int | None) -> bool:
        """Whether an object of team `team_id` is in scope (one of no team only for admins)."""
        return self.teams is None or team_id in self.teams

    # --- rows with a team of their own ---------------------------------------------------------------------

    def owned(self, rows: QuerySet) -> QuerySet:
        """`rows` of a model with a `team` (models, deployments, adapters, routes) narrowed to the scope."""
        return scoped(rows, self.teams)

    def deployments(self, rows: QuerySet | None = None) -> QuerySet:
        from console.deployments.models import Deployment

        return self.owned(Deployment.objects.all() if rows is None else rows)

    def models(self, rows: QuerySet | None = None) -> QuerySet:
        from console.catalog.models import Model

        return self.owned(Model.objects.all() if rows is None else rows)

    def usage(self, rows: QuerySet) -> QuerySet:
        """Usage buckets (console/usage/models.py) of the scope's teams; a deleted team's only for admins."""
        return self.owned(rows)

    # --- rows that belong to a team through another ------------------------------------------------------------

    def replicas(self, rows: QuerySet | None = None) -> QuerySet:
        """Replicas of the scope's deployments."""
        from console.deployments.models import Replica

        rows = Replica.objects.all() if rows is None else rows
        return rows if self.teams is None else rows.filter(deployment__team_id__in=self.teams)

    def replica(self, row: dict) -> dict:
        """A replica on a shared GPU (a dict with its deployment's `team`) as the scope may see it: another team's
        goes unnamed, and so do its reasons, which may name it; its memory still shows, the GPUs being shared."""
        if self.owns(row["team"]):
            return row
        unsaid = {k: "" for k in ("action", "reason", "observed_reason") if k in row}
        return row | unsaid | {"deployment": OTHER_TEAM}

    def samples(self, rows: QuerySet | None = None) -> QuerySet:
        """Measured loads (console/catalog/models.py MemorySample) of the scope's deployments (a load is its
        deployment's, whichever team's model it loaded); those of a deployment since deleted only for admins."""
        from console.catalog.models import MemorySample

        rows = MemorySample.objects.all() if rows is None else rows
        return rows if self.teams is None else rows.filter(deployment__in=self.deployments().values("name"))

    def alerts(self, alerts: list) -> list:
        """`alerts` (console/alerts/models.py) of the scope's deployments and replicas and of every host; one of a
        deployment since deleted only for admins."""
        if self.teams is None:
            return alerts
        named = {a.pk: _deployment_of(a.object) for a in alerts}
        mine = set()
        wanted = sorted({n for n in named.values() if n})
        for i in range(0, len(wanted), _CHUNK):
            mine |= set(self.deployments().filter(name__in=wanted[i:i + _CHUNK]).values_list("name", flat=True))
        return [a for a in alerts if named[a.pk] is None or named[a.pk] in mine]

    # --- the timeline ----------------------------------------------------------------------------------------

    def events(self, rows: QuerySet) -> QuerySet:
        """Events (console/events/models.py) of the scope's objects, as stamped when recorded (event_teams), of
        the objects every team shares (hosts, the strategy, alert rules), and of the tokens of users who share a
        team with the scope; for admins, all of them."""
        if self.teams is None:
            return rows
        fellows = get_user_model().objects.order_by().filter(teams__in=self.teams).values("username")
        # A user name holds no "/" (Django's validator), so USER runs from after "token/" to the next "/"; only
        # token events are cut (a negative length is an error on PostgreSQL).
        user = Case(When(object__startswith="token/", then=Substr(
            "object", 7, Greatest(StrIndex(Substr("object", 7), Value("/")) - 1, Value(0)))), default=Value(""))
        return rows.alias(token_user=user).filter(
            Q(team__in=self.teams) | Q(team__isnull=True) & (FLEET_OBJECTS | Q(object__startswith="token/",
                                                                                token_user__in=fellows)))

    # --- series ---------------------------------------------------------------------------------------------

    def request_rate_series(self) -> list[tuple[str, int]]:
        """The series (kind, object id) whose sum is the request rate the scope may see: the fleet's for admins,
        else each of its teams' (console/series/sampler.py records both)."""
        from console.series.metrics import FLEET, TEAM

        return [(FLEET, 0)] if self.teams is None else [(TEAM, t) for t in sorted(self.teams)]


def _deployment_of(obj: str) -> str | None:
    """The deployment an object is or belongs to (deployment/NAME, replica/NAME#I); None for any other."""
    kind, _, name = obj.partition("/")
    if kind == "deployment":
        return name
    return name.rpartition("#")[0] if kind == "replica" else None


def event_teams(keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int | None]:
    """The team owning each event's object now, by (object, deployment) as a note names them: a deployment's and
    its replicas' (and whatever else names a deployment), a model's, an adapter's, a route's, a team's own; None
    for what no team owns (hosts, the strategy, alert rules, tokens) and for an object that is gone, which only
    admins see then (a writer deleting an object names its team itself). A few queries, however many keys."""
    from console.accounts.models import Team
    from console.catalog.models import Adapter, Model
    from console.deployments.models import Deployment
    from console.routes.models import Route

    # Each owning kind's model and the field that is its team.
    owners = {"deployment": (Deployment, "team_id"), "model": (Model, "team_id"), "adapter": (Adapter, "team_id"),
              "route": (Route, "team_id"), "team": (Team, "pk")}
    wanted: dict[str, set[str]] = {kind: set() for kind in owners}
    keyed: dict[tuple[str, str], tuple[str, str] | None] = {}
    for obj, deployment in set(keys):
        kind, _, name = obj.partition("/")
        named = _deployment_of(obj) or deployment  # a replica's is its deployment's, and so is what names one
        owner = (kind, name) if kind in owners and kind != "deployment" else ("deployment", named) if named else None
        keyed[(obj, deployment)] = owner
        if owner is not None:
            wanted[owner[0]].add(owner[1])
    found: dict[tuple[str, str], int] = {}
    for kind, names in wanted.items():
        (model, team), ordered = owners[kind], sorted(names)
        for i in range(0, len(ordered), _CHUNK):
            rows = model.objects.order_by().filter(name__in=ordered[i:i + _CHUNK]).values_list("name", team)
            found |= {(kind, name): owner for name, owner in rows}
    return {key: found.get(owner) if owner else None for key, owner in keyed.items()}
