from django.apps import AppConfig


class RealtimeConfig(AppConfig):
    name = "console.realtime"
    label = "realtime"

    def ready(self) -> None:
        from console.realtime.access import connect_signals

        connect_signals()  # browser sockets' access is checked again when membership or a session changes
