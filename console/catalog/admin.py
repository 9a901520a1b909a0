from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import transaction

from console.bulk import update_values
from console.catalog.models import Calibration, MemorySample, Model
from console.catalog.services import ARTIFACT_FIELDS, checked_edit, read_artifact
from console.changes import begin_rollout, mark_stale, wake_scheduler
from console.errors import Invalid
from console.events.admin import AuditedAdmin


class ModelForm(forms.ModelForm):
    """A model's name and directory; a new directory is read as registration reads it, and refused (naming what is
    wrong) unless it holds a model every deployment and adapter of this one can be served from (checked_edit, as
    the API's PATCH)."""

    class Meta:
        model = Model
        fields = ("name", "path")

    read: dict | None = None  # ARTIFACT_FIELDS read from a new directory
    estimates: dict[int, dict] | None = None  # its deployments' breakdowns from it, by primary key

    def clean(self):
        cleaned = super().clean()
        if "path" in self.changed_data and cleaned.get("path"):
            try:
                artifact, self.read = read_artifact(cleaned["path"])
                self.estimates = (checked_edit(self.instance, artifact, self.read,
                                               self.instance.deployments.order_by("pk")) if self.instance.pk else {})
            except Invalid as e:
                raise ValidationError({"path": str(e)}) from None
            cleaned["path"] = self.read["path"]
        return cleaned


@admin.register(Model)
class ModelAdmin(AuditedAdmin):
    form = ModelForm
    list_display = ("name", "architecture", "task", "parameters", "weights_bytes", "estimate_bytes")
    search_fields = ("name", "architecture")
    readonly_fields = (*ARTIFACT_FIELDS, "created")

    def audit_object(self, obj):
        return f"model/{obj.name}", ""

    # Its path is in the desired state of every replica of its deployments: as a deployment's edit does
    # (console/deployments/admin.py), the hosts running them are rebuilt and the scheduler woken, not at its resync.
    # What its files say (figures, each deployment's estimate) is stored with it: admission reserves by them. A new
    # directory rolls its deployments' replicas onto it one at a time, as the API's PATCH does.
    def save_model(self, request, obj, form, change):
        from console.deployments.models import Deployment  # deployments depends on catalog

        if change and form.read:  # before the row changes: the replicas hold what they run now
            begin_rollout(Deployment.objects.filter(model=obj).order_by("pk"))
        for field, value in (form.read or {}).items():
            setattr(obj, field, value)
        super().save_model(request, obj, form, change)
        # In key order, as every writer of deployment rows takes them.
        update_values(Deployment, ["estimates"], sorted((form.estimates or {}).items()))
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
