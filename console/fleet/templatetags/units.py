from django import template

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
