from django.contrib import admin

from console.accounts.models import ApiToken, Team
from console.events.admin import AuditedAdmin


@admin.register(ApiToken)
class ApiTokenAdmin(AuditedAdmin):
    list_display = ("user", "name", "prefix", "scope", "created", "last_used", "expires", "revoked")
    readonly_fields = ("prefix", "token_hash", "created", "last_used", "revoked")

    def audit_object(self, obj):
        return obj.timeline_object, ""


@admin.register(Team)
class TeamAdmin(AuditedAdmin):
    list_display = ("name", "created")
    filter_horizontal = ("members",)
    search_fields = ("name",)

    def audit_object(self, obj):
        return obj.timeline_object, ""
