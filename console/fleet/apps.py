from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "console.fleet"
    label = "fleet"
