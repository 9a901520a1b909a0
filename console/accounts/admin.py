from django.contrib import admin

from console.accounts.models import ApiToken, Team


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("user", "name", "prefix", "scope", "created", "last_used", "expires", "revoked")
    readonly_fields = ("prefix", "token_hash", "created", "last_used", "revoked")


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name", "created")
    filter_horizontal = ("members",)
    search_fields = ("name",)
