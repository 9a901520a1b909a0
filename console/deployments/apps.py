from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "console.deployments"
    label = "deployments"

    def ready(self) -> None:
        from console.deployments import checks  # noqa: F401  (registers the system checks)
