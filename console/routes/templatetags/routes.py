from django import template

from console.accounts.teams import teams_of
from console.routes.services import routes_to

register = template.Library()


@register.inclusion_tag("routes/_routes_to.html", takes_context=True)
def routes_section(context, deployment: str) -> dict:
    """The routes of the viewer's teams that send `deployment` traffic, for its page."""
    return {"deployment": deployment, "routes": routes_to(deployment, teams_of(context["request"].user))}
