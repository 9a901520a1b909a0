from django.apps import AppConfig
from django.db.backends.signals import connection_created


class DeploymentsConfig(AppConfig):
    name = "console.deployments"
    label = "deployments"

    def ready(self) -> None:
        from console.deployments import checks  # noqa: F401  (registers the system checks)
        from console.pgloaders import install

        # Every query benefits; a scheduler pass (this app's) reads the most timestamps by far.
        connection_created.connect(install, dispatch_uid="console.pgloaders")
