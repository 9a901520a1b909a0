from django.contrib import admin

from console.catalog.models import Model


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ("name", "architecture", "task", "parameters", "weights_bytes", "estimate_bytes")
    search_fields = ("name", "architecture")
