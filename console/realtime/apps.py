from django.apps import AppConfig


class RealtimeConfig(AppConfig):
    name = "console.realtime"
    label = "realtime"
