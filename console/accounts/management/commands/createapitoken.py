from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from console.accounts.models import ApiToken


class Command(BaseCommand):
    help = "Print a new REST API token for USERNAME (the user is created if needed). Shown once."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="a label for the token")

    def handle(self, username, name, **options):
        user, created = get_user_model().objects.get_or_create(username=username)
        if created:
            user.set_unusable_password()
            user.save()
            self.stderr.write(f"created user {username} (no password: API access only)")
        _, token = ApiToken.issue(user, name)
        self.stdout.write(token)
