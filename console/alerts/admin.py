from django.contrib import admin

from console.alerts.models import Alert, AlertRule, WebhookDelivery
from console.events.admin import AuditedAdmin


@admin.register(AlertRule)
class AlertRuleAdmin(AuditedAdmin):
    list_display = ("kind", "enabled", "window_s", "threshold", "webhook_url")

    def audit_object(self, obj):
        return f"alert/{obj.kind}", ""


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ("rule", "object", "since", "resolved_at", "message")
    list_filter = ("rule", "resolved_at")


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ("alert", "url", "attempts", "next_attempt_at", "delivered_at", "given_up_at", "last_error")
