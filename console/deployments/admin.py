from django.contrib import admin

from console.deployments.models import Deployment, Replica
from console.events.admin import AuditedAdmin


class ReplicaInline(admin.TabularInline):
    model = Replica
    extra = 0
    fields = ("index", "host", "reserved_bytes", "desired_state", "observed_state", "measured_bytes", "reason")
    readonly_fields = ("observed_state", "measured_bytes", "reason")


@admin.register(Deployment)
class DeploymentAdmin(AuditedAdmin):
    list_display = ("name", "model", "replicas", "priority", "state", "reason")
    list_filter = ("state", "priority")
    inlines = [ReplicaInline]

    def audit_object(self, obj):
        return f"deployment/{obj.name}", obj.name


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = ("__str__", "host", "desired_state", "observed_state", "reserved_bytes", "measured_bytes")
    list_filter = ("observed_state",)
