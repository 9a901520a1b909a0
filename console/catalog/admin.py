from django.contrib import admin

from console.catalog.models import Calibration, MemorySample, Model
from console.events.admin import AuditedAdmin


@admin.register(Model)
class ModelAdmin(AuditedAdmin):
    list_display = ("name", "architecture", "task", "parameters", "weights_bytes", "estimate_bytes")
    search_fields = ("name", "architecture")

    def audit_object(self, obj):
        return f"model/{obj.name}", ""


@admin.register(MemorySample)
class MemorySampleAdmin(admin.ModelAdmin):
    list_display = ("deployment", "family", "device", "dtype", "batch", "seq", "estimated_bytes", "calibrated_bytes",
                    "measured_bytes", "created")
    list_filter = ("family", "device")


@admin.register(Calibration)
class CalibrationAdmin(admin.ModelAdmin):
    list_display = ("family", "device", "factor", "samples", "updated")
