from django import template
from django.urls import reverse

from console.accounts.scope import TeamScope
from console.events.query import EventFilter, page

register = template.Library()
RECENT = 10


def recent_of(object_key: str, scope: TeamScope, limit: int = RECENT) -> dict:
    """The last events of a deployment, host or other object that `scope` may read, as the pages show them."""
    events, more = page(EventFilter(object=object_key), scope, limit=limit)
    return {"events": events, "more": more is not None, "object_key": object_key,
            "all_url": f"{reverse('events')}?object={object_key}"}


@register.inclusion_tag("events/_list.html", takes_context=True)
def recent_events(context, object_key: str, limit: int = RECENT) -> dict:
    """recent_of() for the page's reader (its request's user): a page shows the events its reader's scope holds."""
    return recent_of(object_key, TeamScope.of(context["request"].user), limit)


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
