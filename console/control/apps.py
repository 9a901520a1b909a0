from django.apps import AppConfig
from django.db.backends.signals import connection_created


class ControlConfig(AppConfig):
    """The control loop: the scheduler's election and passes, leases, and the desired and observed state they
    read and write (its rows are the deployments and fleet apps'), and the commands that run it (up, scheduler)."""

    name = "console.control"
    label = "control"

    def ready(self) -> None:
        from console.control import checks  # noqa: F401  (registers the system checks)
        from console.control.subscribers import subscribe
        from console.pgloaders import install

        # Every query benefits; a scheduler pass reads the most timestamps by far.
        connection_created.connect(install, dispatch_uid="console.pgloaders")
        subscribe()  # the domain apps' change signals (console/changes.py)
