from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "console.fleet"
    label = "fleet"

    def ready(self) -> None:
        from console.fleet import hostnames  # noqa: F401  (registers its system check)
