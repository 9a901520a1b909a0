"""`{% deployment_charts name %}`, `{% host_charts name %}` and `{% fleet_charts %}`: the charts sections,
rendered with the page (the range from its `range` parameter, the scope of its reader) and then polled by htmx."""

from __future__ import annotations

from django import template

from console.accounts.scope import TeamScope
from console.series.panels import deployment_panel, fleet_panel, host_panel, range_key

register = template.Library()


def _range(context) -> str:
    request = context.get("request")
    return range_key(request.GET.get("range") if request is not None else None)


@register.inclusion_tag("series/_charts.html", takes_context=True)
def deployment_charts(context, name: str) -> dict:
    return {"panel": deployment_panel(name, _range(context), TeamScope.of(context["request"].user))}


@register.inclusion_tag("series/_charts.html", takes_context=True)
def fleet_charts(context) -> dict:
    return {"panel": fleet_panel(_range(context), TeamScope.of(context["request"].user))}


@register.inclusion_tag("series/_charts.html", takes_context=True)
def host_charts(context, name: str) -> dict:
    return {"panel": host_panel(name, _range(context))}
