"""The dashboard: a summary of the whole fleet, then one page of hosts and one of deployments, each searched
and filtered by plain GET parameters so every view of it is a link (and its websocket renders the same)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from console.accounts.auth import actor_of
from console.accounts.scope import OTHER_TEAM, TeamScope
from console.deployments.models import Deployment, DeploymentState
from console.deployments.policy_form import parse_selector
from console.deployments.presenters import deployment_row, heading_for, load_progress
from console.errors import DomainError
from console.fleet.models import Host, PlacementSettings, foreign_bytes
from console.fleet.presenters import HOST_STATES, fleet, fleet_summary, in_state
from console.fleet.services import set_placement, set_strategy
from console.fleet.templatetags.units import gib
from console.pagination import MAX_QUERY, name_search, page_number, page_within, pager, query_string, shown

HOSTS_PER_PAGE = 25
DEPLOYMENTS_PER_PAGE = 50
# The dashboard's own query parameters: hosts (q, state, page) and deployments (dq, dstate, dpage).
HOST_PARAMS = ("q", "state", "page")
DEPLOYMENT_PARAMS = ("dq", "dstate", "dpage")

# One line per strategy for the dashboard's "how placement is decided" note (docs/placement.md has the rest).
STRATEGY_SUMMARIES = {
    "fill-first": "packs each replica onto the fullest GPU already in use that fits, so the fewest GPUs are busy",
    "balance": "puts each replica on the GPU with the most free memory, spreading load across hosts",
    "memory-optimized": "best fit (the GPU a replica fits most tightly), then a short search that repacks new "
                        "replicas when some do not fit",
    "latency-sensitive": "gives latency-critical replicas a GPU of their own or a complementary neighbour, and "
                         "packs the rest onto GPUs in use",
}


def _segments(gpu: dict) -> dict:
    """Bar geometry in percent of the GPU's total: one segment per replica, then foreign use."""
    total = gpu["total_bytes"] or 1
    segments = []
    for r in gpu["replicas"]:
        width = min(max(100 * r["reserved_bytes"] / total, 0.8), 100)  # keep tiny replicas visible
        fill = 100 * (r["measured_bytes"] or 0) / (r["reserved_bytes"] or 1)
        progress = load_progress(r["state"], r["loaded_bytes"], r["loading_total_bytes"])
        toward = heading_for(r["state"], r["desired_state"])
        segments.append(r | {"width": round(width, 3), "fill": round(min(fill, 100), 1), "progress": progress,
                             "toward": toward, "tooltip": _tooltip(r, progress, toward),
                             "labelled": width >= _label_percent(r["deployment"]),
                             "url": _url(r["deployment"])})
    foreign = foreign_bytes(gpu["used_bytes"], gpu["own_bytes"], sum(r["measured_bytes"] or 0 for r in gpu["replicas"]))
    return gpu | {
        "segments": segments,
        "foreign_bytes": foreign,
        # An agent may say a GPU uses more than it has: the bar still ends at the GPU's edge.
        "foreign_width": round(min(100 * foreign / total, 100), 3),
        "reserved_pct": round(100 * gpu["reserved_bytes"] / total, 1),
    }


def _label_percent(name: str) -> float:
    """The share of a 1,100-pixel bar (the dashboard at its usual width) a segment needs to show `name`;
    narrower ones rely on their tooltip and the legend."""
    return (7 * len(name) + 14) / 11


def _tooltip(r: dict, progress: int | None, toward: str | None) -> str:
    """What a segment says on hover: which replica, doing what, how much memory, and why it is there."""
    state = r["state"] + (f" {progress}%" if progress is not None else "") + (f" → {toward}" if toward else "")
    parts = [f"{r['deployment']}#{r['index']}", state, f"reserved {gib(r['reserved_bytes'])}",
             f"measured {gib(r['measured_bytes'])}"]
    if r["mps_percentage"]:
        parts.append(f"MPS {r['mps_percentage']}% of SMs")
    if r["action"] or r["reason"]:
        parts.append(": ".join(p for p in (r["action"], r["reason"]) if p))
    if r["observed_reason"]:
        parts.append(f"agent: {r['observed_reason']}")
    return " · ".join(parts)


def scheduler_context() -> dict:
    strategy, set_at_run_time = PlacementSettings.strategy_now()
    return {
        "strategy": strategy,
        "strategies": [(name, STRATEGY_SUMMARIES[name]) for name in STRATEGY_SUMMARIES],
        "set_at_run_time": set_at_run_time,
        "summary": STRATEGY_SUMMARIES.get(strategy, ""),
        "quiet_window_min": round(settings.MODELGRID_QUIET_WINDOW_SECONDS / 60, 1),
        "cooldown_min": round(settings.MODELGRID_SCALE_COOLDOWN_SECONDS / 60, 1),
    }


@dataclass(frozen=True)
class Filters:
    """What the dashboard was asked to show, read leniently: a value it cannot use is dropped, with a note."""

    q: str = ""
    state: str = ""
    page: int = 1
    dq: str = ""
    dstate: str = ""
    dpage: int = 1
    notes: tuple[str, ...] = ()

    @property
    def hosts_filtered(self) -> bool:
        return bool(self.q or self.state)

    @property
    def deployments_filtered(self) -> bool:
        return bool(self.dq or self.dstate)


def read_filters(query: QueryDict | dict) -> Filters:
    """The dashboard's parameters in `query`, each unusable one dropped with a note saying what is shown."""
    notes = []

    def one_of(param: str, allowed: tuple[str, ...], what: str) -> str:
        value = str(query.get(param, "") or "")
        if value and value not in allowed:
            notes.append(f"{param} “{shown(value)}” is not a {what} state ({', '.join(allowed)}); showing every {what}")
            return ""
        return value

    page, note = page_number(query, "page")
    dpage, dnote = page_number(query, "dpage")
    notes += [n for n in (note, dnote) if n]
    state = one_of("state", HOST_STATES, "host")
    dstate = one_of("dstate", tuple(DeploymentState.values), "deployment")
    return Filters(q=str(query.get("q", "") or "").strip()[:MAX_QUERY], state=state, page=page,
                   dq=str(query.get("dq", "") or "").strip()[:MAX_QUERY], dstate=dstate, dpage=dpage,
                   notes=tuple(notes))


def _with(query: QueryDict | dict, drop: tuple[str, ...] = (), **values: str) -> str:
    """A relative link to the dashboard with `values` set and `drop` left out, the rest of `query` kept."""
    params = QueryDict(query_string(query, drop=(*drop, *values)), mutable=True)
    for name, value in values.items():
        params[name] = value
    return f"?{params.urlencode()}" if params else "?"


def _big_bytes(n: int) -> str:
    """Fleet-sized memory: TiB past 1 TiB, else as the GPUs show it."""
    return f"{n / (1 << 40):.1f} TiB" if n >= 1 << 40 else gib(n)


def summary_view(summary: dict, query: QueryDict | dict) -> dict:
    """The summary with its words and the links that filter the lists below by each state."""
    mem = summary["memory"]
    return summary | {
        "hosts": summary["hosts"] | {"states": [
            {"state": s, "count": n, "url": _with(query, drop=("page",), state=s)}
            for s, n in summary["hosts"]["states"]]},
        "memory": mem | {"reserved": _big_bytes(mem["reserved_bytes"]), "used": _big_bytes(mem["used_bytes"]),
                         "total": _big_bytes(mem["total_bytes"])},
        "replicas": summary["replicas"] | {"states": [
            {"state": s, "count": n, "pct": round(100 * n / summary["replicas"]["total"], 2)}
            for s, n in summary["replicas"]["states"]]},
        "deployments": summary["deployments"] | {"states": [
            {"state": s, "count": n, "url": _with(query, drop=("dpage",), dstate=s) + "#deployments"}
            for s, n in summary["deployments"]["states"]]},
    }


@cache
def _deployment_url_prefix() -> str:
    return reverse("deployment", args=["-"])[:-2]


def deployment_url(name: str) -> str:
    """reverse("deployment", name) without reversing each time: a page of hosts links a few hundred replicas,
    and names are URL-safe by construction (console.catalog.models.NAME_VALIDATOR)."""
    return f"{_deployment_url_prefix()}{name}/"


def _host_view(host: dict) -> dict:
    gpus = [_segments(g) for g in host["gpus"]]
    return host | {"gpus": gpus, "asleep": [r | {"url": _url(r["deployment"])} for r in host["asleep"]],
                   "replica_count": sum(len(g["replicas"]) for g in gpus),
                   "reserved_bytes": sum(g["reserved_bytes"] for g in gpus),
                   "total_bytes": sum(g["total_bytes"] for g in gpus)}


def _url(deployment: str) -> str:
    return "#" if deployment == OTHER_TEAM else deployment_url(deployment)


def grid_context(query: QueryDict | dict | None, scope: TeamScope) -> dict:
    """Everything the live part of the dashboard shows for `query` (a request's GET; none: the first page of
    every host and deployment) within `scope`: the fleet's summary, a page of hosts (other teams' replicas
    unnamed) and a page of the scope's deployments."""
    query = QueryDict() if query is None else query
    filters = read_filters(query)
    hosts = name_search(Host.objects.all(), filters.q)
    if filters.state:
        hosts = in_state(hosts, filters.state)
    host_page, host_rows, host_note = page_within(hosts, filters.page, HOSTS_PER_PAGE, "page")
    deployments = name_search(scope.deployments(Deployment.objects.select_related("model")
                                                .prefetch_related("replica_set")), filters.dq)
    if filters.dstate:
        deployments = deployments.filter(state=filters.dstate)
    dep_page, dep_rows, dep_note = page_within(deployments, filters.dpage, DEPLOYMENTS_PER_PAGE, "dpage")
    return {
        "summary": summary_view(fleet_summary(scope), query),
        "filters": filters,
        "notes": [*filters.notes, *(n for n in (host_note, dep_note) if n)],
        "hosts": [_host_view(h) for h in fleet(host_rows, scope)],
        "host_pager": pager(host_page, query, "page"),
        "hosts_clear_url": _with(query, drop=HOST_PARAMS),
        "deployments": [deployment_row(d) | {"url": deployment_url(d.name)} for d in dep_rows],
        "deployment_pager": pager(dep_page, query, "dpage"),
        "deployments_clear_url": _with(query, drop=DEPLOYMENT_PARAMS) + "#deployments",
    }


@login_required
@require_safe
def host_page(request, name: str):
    """One host: its GPUs and replicas as on the dashboard, its charts and its recent events."""
    hosts = fleet(Host.named(name), TeamScope.of(request.user))
    if not hosts:
        raise Http404(f"no host named {name!r}")
    return render(request, "fleet/host.html", {"host": _host_view(hosts[0])})


@login_required
@require_POST
def update_placement(request, name: str):
    """Save a host's labels and taints from its page; back to the page with what changed, or why not."""
    before = Host.named(name).values("labels", "taints").first()
    if before is None:
        raise Http404(f"no host named {name!r}")
    try:
        changes = {field: parse_selector(request.POST.get(field, ""), field, example)
                   for field, example in (("labels", "zone=east, rack=r12"), ("taints", "pool=ml"))}
        host = set_placement(request.user, name, changes, actor=actor_of(request))
    except DomainError as e:
        messages.error(request, f"Labels and taints not saved: {e}. Nothing was changed.")
    else:
        changed = [f for f in ("labels", "taints") if before[f] != getattr(host, f)]
        messages.success(request, f"Saved {' and '.join(changed)}; the scheduler plans with them at its next pass."
                         if changed else "Nothing changed.")
    return redirect(reverse("host", args=[name]) + "#placement")


@login_required
@require_POST
def update_strategy(request):
    """Change the placement strategy from the dashboard; back to it with what changed, or why not."""
    try:
        strategy = set_strategy(request.user, request.POST.get("strategy", ""), actor=actor_of(request))
    except DomainError as e:
        messages.error(request, f"Strategy not changed: {e}.")
    else:
        messages.success(request, f"Placement strategy: {strategy}, from the scheduler's next pass. Replicas that "
                         "run stay where they are; new placements follow it.")
    return redirect(reverse("dashboard") + "#scheduler-note")


@login_required
def dashboard(request):
    live_query = request.GET.urlencode()
    return render(request, "fleet/dashboard.html", grid_context(request.GET, TeamScope.of(request.user)) | {
        "scheduler": scheduler_context(),
        "host_states": HOST_STATES,
        "deployment_states": DeploymentState.values,
        # The websocket renders the same page of the same lists, so a live update never swaps in another view.
        "live_url": "/ws/dashboard/" + (f"?{live_query}" if live_query else ""),
    })
