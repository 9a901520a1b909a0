from django.contrib import admin
from django.db import transaction

from console.bulk import update_in_key_order
from console.changes import wake_scheduler
from console.deployments.models import Deployment, Replica
from console.deployments.services import SERVING_FIELDS
from console.events.admin import AuditedAdmin
from console.fleet.models import Host


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

    # Its estimate is made for its serving settings when it is created, and admission reserves by it: as in the
    # API, those settings are fixed once it exists (a new version is a new deployment), and the estimate is never
    # typed in. One added here gets its estimate from the scheduler's first pass.
    def get_readonly_fields(self, request, obj=None):
        return ("estimates", *SERVING_FIELDS) if obj is not None else ("estimates",)

    # As the API's changes do: the hosts running it get their desired state rebuilt, and the scheduler is woken
    # (unwoken passes plan only when something is due: an edit here would otherwise wait for the resync).
    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        self._replan([obj])

    def delete_model(self, request, obj):
        hosts = self._hosts([obj])
        super().delete_model(request, obj)
        self._replan([], hosts)

    def delete_queryset(self, request, queryset):
        hosts = self._hosts(queryset)
        super().delete_queryset(request, queryset)
        self._replan([], hosts)

    @staticmethod
    def _hosts(deployments) -> list[int]:
        return list(Host.objects.filter(replicas__deployment__in=list(deployments)).values_list("pk", flat=True))

    def _replan(self, deployments, hosts=()) -> None:
        update_in_key_order(Host.objects.filter(pk__in=[*hosts, *self._hosts(deployments)]), desired_digest="")
        transaction.on_commit(wake_scheduler)


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = ("__str__", "host", "desired_state", "observed_state", "reserved_bytes", "measured_bytes")
    list_filter = ("observed_state",)
