"""Usage on /metrics: counters per team, token and deployment, read from the database's totals at each scrape, so
every console process shows the same figures (all processes' requests), and they only grow: the totals are never
pruned with the buckets behind the charts."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from console.accounts.models import ApiToken, Team
from console.usage.models import UsageTotal
from console.usage.report import token_label
from console.usage.store import COUNTS

# (team, token, deployment) labels -> the counts, in COUNTS' order
Totals = dict[tuple[str, str, str], list]
FAMILIES = (("requests", "Requests through the gateway that reached a deployment"),
            ("errors", "Those answered with status >= 400 (limits' refusals among them)"),
            ("prompt_tokens", "Prompt tokens, as the engines counted them"),
            ("completion_tokens", "Completion tokens, as the engines counted them"),
            ("queue_seconds", "Time the requests waited for a ready replica"))


def read_usage_totals() -> Totals:
    """The totals per team, token and deployment, named (sync, DB)."""
    sums = {(team, token, deployment): values for team, token, deployment, *values
            in UsageTotal.objects.order_by().values_list("team_id", "token_id", "deployment", *COUNTS)}
    teams = dict(Team.objects.filter(pk__in={k[0] for k in sums}).values_list("pk", "name"))
    tokens = {t.pk: token_label(t.name, t.prefix, t.user.get_username())
              for t in ApiToken.objects.filter(pk__in={k[1] for k in sums}).select_related("user")}
    out: Totals = {}
    for (team, token, deployment), values in sums.items():
        key = (teams.get(team, "(deleted)"), tokens.get(token, "(deleted)"), deployment)
        row = out.setdefault(key, [0, 0, 0, 0, 0.0])
        for i, v in enumerate(values):
            row[i] += v
    return out


class UsageCollector:
    """One scrape's usage counters, from `totals` (None: the database could not be read; they are left out)."""

    def __init__(self, totals: Totals | None) -> None:
        self.totals = totals

    def collect(self) -> Iterator[Metric]:
        if self.totals is None:
            return
        for i, (name, text) in enumerate(FAMILIES):
            family = CounterMetricFamily(f"modelgrid_usage_{name}", text, labels=["team", "token", "deployment"])
            for labels, values in sorted(self.totals.items()):
                family.add_metric(list(labels), values[i])
            yield family
