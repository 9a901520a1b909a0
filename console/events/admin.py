from django.contrib import admin
from django.db.models import Model, QuerySet

from console.accounts.auth import actor_of
from console.events.models import Event
from console.events.record import Note, record


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    """The timeline, read-only: an event is never edited after the fact."""

    list_display = ("last_seen", "type", "reason", "object", "message", "count", "actor")
    list_filter = ("type", "reason")
    search_fields = ("object", "message", "actor")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class AuditedAdmin(admin.ModelAdmin):
    """Changes made in the Django admin go on the timeline like anyone's: who, and each field before → after.
    `audit_object` names the timeline object of a row ("deployment/NAME")."""

    def audit_object(self, obj) -> tuple[str, str]:
        """(object, deployment it concerns or "")."""
        raise NotImplementedError

    def save_model(self, request, obj, form, change):
        before = {f: form.initial.get(f) for f in form.changed_data}
        super().save_model(request, obj, form, change)
        if change and not form.changed_data:
            return
        words = ("; ".join(f"{f} {_shown(before[f])!r} → {_shown(form.cleaned_data.get(f))!r}"
                           for f in form.changed_data) if change else "created in the admin")
        self._tell(request, obj, "Changed" if change else "Created", words)

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        self._tell(request, obj, "Deleted", "deleted in the admin")

    def delete_queryset(self, request, queryset):
        rows = list(queryset)
        super().delete_queryset(request, queryset)
        for obj in rows:
            self._tell(request, obj, "Deleted", "deleted in the admin")

    def audit_host(self, obj) -> str:
        """The host a row's event concerns, if any (so the host's page shows it)."""
        return ""

    def _tell(self, request, obj, reason: str, words: str) -> None:
        key, deployment = self.audit_object(obj)
        # Its team as the row says, which a row just deleted can no longer be looked up for (a team is its own).
        team = obj.pk if obj._meta.label == "accounts.Team" else getattr(obj, "team_id", None)
        record([Note(key, reason, words, actor=f"{actor_of(request)} (admin)", deployment=deployment,
                     host=self.audit_host(obj), folds=False, team=team)])


def _shown(value):
    """A field's value as the timeline says it: rows of a many-to-many (a team's members) by their names."""
    if isinstance(value, QuerySet | list | tuple) and all(isinstance(v, Model) for v in value):
        return sorted(str(v) for v in value)
    return value
