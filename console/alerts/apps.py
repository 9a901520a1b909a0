from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "console.alerts"
    label = "alerts"
