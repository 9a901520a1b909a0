from django import template

from console.alerts.evaluate import open_alerts

register = template.Library()


@register.inclusion_tag("alerts/_banner.html")
def alert_banner() -> dict:
    return {"alerts": open_alerts()}
