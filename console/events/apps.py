from django.apps import AppConfig


class EventsConfig(AppConfig):
    name = "console.events"
    label = "events"

    def ready(self) -> None:
        from console.accounts.scope import event_teams
        from console.events import record

        record.owners_of = event_teams  # who owns each event's object: the team scope's to say
