from django.apps import AppConfig


class RoutesConfig(AppConfig):
    name = "console.routes"
    default_auto_field = "django.db.models.BigAutoField"
