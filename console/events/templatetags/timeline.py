from django import template
from django.urls import reverse

from console.events.query import EventFilter, page

register = template.Library()
RECENT = 10


@register.inclusion_tag("events/_list.html")
def recent_events(object_key: str, limit: int = RECENT, teams: frozenset[int] | None = None) -> dict:
    """The last events of a deployment, host or other object (of `teams`' objects; None: all), as the pages show
    them."""
    events, more = page(EventFilter(object=object_key), limit=limit, teams=teams)
    return {"events": events, "more": more is not None, "object_key": object_key,
            "all_url": f"{reverse('events')}?object={object_key}"}


@register.filter
def object_url(object_key: str) -> str:
    """The page of an event's object, where there is one ("" otherwise)."""
    kind, _, name = object_key.partition("/")
    if kind == "replica":
        return reverse("deployment", args=[name.rsplit("#", 1)[0]])
    if kind == "deployment":
        return reverse("deployment", args=[name])
    if kind == "host":
        return reverse("host", args=[name])
    if kind in ("model", "adapter"):
        return reverse("models")
    return ""
