from django import template

from console.routes.services import routes_to

register = template.Library()


@register.inclusion_tag("routes/_routes_to.html")
def routes_section(deployment: str) -> dict:
    """The routes that send `deployment` traffic, for its page."""
    return {"deployment": deployment, "routes": routes_to(deployment)}
