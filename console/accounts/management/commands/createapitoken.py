from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from console.accounts.models import ApiToken, Scope
from console.events.record import command_actor


class Command(BaseCommand):
    help = ("Print a new API token for USERNAME (the user is created if needed). Shown once. "
            "--scope inference makes a token that may only call the inference gateway.")

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="a label for the token")
        parser.add_argument("--scope", default=Scope.ALL,
                            help="all (REST API and inference, the default) or inference (the gateway only)")

    def handle(self, username, name, scope, **options):
        if scope not in Scope.values:
            choices = ", ".join(f"{value} ({label})" for value, label in Scope.choices)
            raise CommandError(f"unknown scope {scope!r}; choose one of: {choices}")
        user, created = get_user_model().objects.get_or_create(username=username)
        if created:
            user.set_unusable_password()
            user.save()
            self.stderr.write(f"created user {username} (no password: API access only)")
        _, token = ApiToken.issue(user, name, scope=scope, actor=command_actor("createapitoken"))
        if scope != Scope.ALL:
            self.stderr.write(f"scope {scope}: this token may only call the inference gateway (/v1, /v2)")
        self.stdout.write(token)
