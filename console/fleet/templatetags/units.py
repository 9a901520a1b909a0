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
