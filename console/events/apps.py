from django.apps import AppConfig


class EventsConfig(AppConfig):
    name = "console.events"
    label = "events"
