from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from console.accounts.expiry import LIFETIME_FORM, parse_lifetime, stamp
from console.accounts.models import ApiToken, Scope
from console.errors import Invalid
from console.events.record import command_actor


class Command(BaseCommand):
    help = ("Print a new API token for USERNAME (the user is created if needed). Shown once. "
            "--scope inference makes a token that may only call the inference gateway; --expires-in one that "
            "is refused after that long.")

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="a label for the token")
        parser.add_argument("--scope", default=Scope.ALL,
                            help="all (REST API and inference, the default) or inference (the gateway only)")
        parser.add_argument("--expires-in", default=None,
                            help=f"refuse the token after this long: {LIFETIME_FORM} (default: never expires)")

    def handle(self, username, name, scope, expires_in, **options):
        if scope not in Scope.values:
            choices = ", ".join(f"{value} ({label})" for value, label in Scope.choices)
            raise CommandError(f"unknown scope {scope!r}; choose one of: {choices}")
        try:
            expires = None if expires_in is None else timezone.now() + parse_lifetime(expires_in, "--expires-in")
        except Invalid as e:
            raise CommandError(str(e)) from None
        user, created = get_user_model().objects.get_or_create(username=username)
        if created:
            user.set_unusable_password()
            user.save()
            self.stderr.write(f"created user {username} (no password: API access only)")
        _, token = ApiToken.issue(user, name, scope=scope, expires=expires, actor=command_actor("createapitoken"))
        if expires is not None:
            self.stderr.write(f"expires at {stamp(expires)}")
        if scope != Scope.ALL:
            self.stderr.write(f"scope {scope}: this token may only call the inference gateway (/v1, /v2)")
        self.stdout.write(token)
