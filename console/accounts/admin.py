from django.contrib import admin

from console.accounts.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("user", "name", "prefix", "scope", "created", "last_used", "expires", "revoked")
    readonly_fields = ("prefix", "token_hash", "created", "last_used", "revoked")
