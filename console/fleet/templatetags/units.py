from django import template
from django.utils import timezone

register = template.Library()


@register.filter
def gib(value) -> str:
    """Bytes as GiB (or MiB below 1 GiB), for people."""
    if value is None:
        return "–"
    value = int(value)
    if value >= 1 << 30:
        return f"{value / (1 << 30):.2f} GiB"
    return f"{value / (1 << 20):.1f} MiB"


@register.filter
def percent(fraction) -> str:
    """A signed fraction as a percentage ("+3.2%"), or a dash when unknown."""
    if fraction is None:
        return "–"
    return f"{100 * float(fraction):+.1f}%"


@register.filter
def age(when) -> str:
    """How long ago a moment was, shortly: "12 s", "3 min", "2 h", "5 days"."""
    if not when:
        return "–"
    seconds = max((timezone.now() - when).total_seconds(), 0)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    if seconds < 86400:
        return f"{seconds // 3600:.0f} h"
    days = seconds // 86400
    return f"{days:.0f} day{'s' if days != 1 else ''}"


@register.filter
def ago(when) -> str:
    """A past moment as a short age: "just now", "40 s ago", "3 min ago", "2 h ago", "5 days ago"."""
    if not when:
        return "–"
    if (timezone.now() - when).total_seconds() < 5:
        return "just now"
    return f"{age(when)} ago"


@register.filter
def duration(seconds) -> str:
    """Seconds for people: "33 ms", "0.4 ms", "1.25 s"."""
    if seconds is None:
        return "–"
    seconds = float(seconds)
    if seconds < 0.001:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.2f} s"


@register.filter
def per_second(bytes_per_second) -> str:
    """A bandwidth in bytes/s as GiB/s (or MiB/s below 1 GiB/s)."""
    if not bytes_per_second:
        return "–"
    return gib(bytes_per_second) + "/s"


@register.filter
def ms(value) -> str:
    """Milliseconds, rounded for people: "340 ms", "4.2 ms"."""
    if value is None:
        return "–"
    value = float(value)
    return f"{value:.1f} ms" if value < 10 else f"{value:,.0f} ms"


@register.filter
def rate(value) -> str:
    """Requests per second: "12.5 req/s", "0.03 req/s", "0 req/s"."""
    value = float(value or 0)
    if value == 0:
        return "0 req/s"
    if value < 1:
        return f"{value:.2f} req/s"
    return f"{value:.1f} req/s" if value < 100 else f"{value:,.0f} req/s"
