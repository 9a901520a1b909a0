from django.contrib import admin
from django.db import transaction

from console.catalog.models import Calibration, MemorySample, Model
from console.events.admin import AuditedAdmin
from console.realtime.notify import wake_scheduler


@admin.register(Model)
class ModelAdmin(AuditedAdmin):
    list_display = ("name", "architecture", "task", "parameters", "weights_bytes", "estimate_bytes")
    search_fields = ("name", "architecture")

    def audit_object(self, obj):
        return f"model/{obj.name}", ""

    # Its path is in the desired state of every replica of its deployments: as a deployment's edit does
    # (console/deployments/admin.py), the hosts running them are rebuilt and the scheduler woken, not at its resync.
    def save_model(self, request, obj, form, change):
        from console.deployments.desired import mark_stale  # deployments depends on catalog

        super().save_model(request, obj, form, change)
        if change and form.changed_data:
            mark_stale(obj.deployments.all())
            transaction.on_commit(wake_scheduler)


@admin.register(MemorySample)
class MemorySampleAdmin(admin.ModelAdmin):
    list_display = ("deployment", "family", "device", "dtype", "batch", "seq", "estimated_bytes", "calibrated_bytes",
                    "measured_bytes", "created")
    list_filter = ("family", "device")


@admin.register(Calibration)
class CalibrationAdmin(admin.ModelAdmin):
    list_display = ("family", "device", "factor", "samples", "updated")
