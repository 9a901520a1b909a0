from django import template

from console.accounts.scope import TeamScope
from console.alerts.evaluate import open_alerts

register = template.Library()


@register.inclusion_tag("alerts/_banner.html", takes_context=True)
def alert_banner(context) -> dict:
    return {"alerts": open_alerts(TeamScope.of(context["request"].user))}
