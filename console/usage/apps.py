from django.apps import AppConfig


class UsageConfig(AppConfig):
    name = "console.usage"
    default_auto_field = "django.db.models.BigAutoField"
