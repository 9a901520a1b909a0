from django.contrib import admin

from console.events.admin import AuditedAdmin
from console.fleet.models import AgentCredential, Gpu, Host


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    readonly_fields = ("index", "uuid", "name", "total_bytes", "used_bytes", "utilization", "simulated")


@admin.register(Host)
class HostAdmin(AuditedAdmin):
    list_display = ("name", "endpoint", "connected", "last_seen", "generation", "acked_generation")
    inlines = [GpuInline]

    def audit_object(self, obj):
        return f"host/{obj.name}", ""

    def audit_host(self, obj):
        return obj.name


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("__str__", "name", "total_bytes", "used_bytes", "simulated")
    list_filter = ("simulated", "host")


@admin.register(AgentCredential)
class AgentCredentialAdmin(AuditedAdmin):
    list_display = ("host_name", "prefix", "created", "last_used")
    readonly_fields = ("prefix", "token_hash", "created", "last_used")

    def audit_object(self, obj):
        return f"host/{obj.host_name}", ""

    def audit_host(self, obj):
        return obj.host_name
