from django.apps import AppConfig


class RealtimeConfig(AppConfig):
    name = "console.realtime"
    label = "realtime"

    def ready(self) -> None:
        from console.realtime.access import connect_signals
        from console.realtime.subscribers import subscribe

        connect_signals()  # browser sockets' access is checked again when membership or a session changes
        subscribe()  # the domain apps' change signals (console/changes.py)
