from django.core.management.base import BaseCommand, CommandError

from console.accounts.invites import issue_invite
from console.accounts.models import Team
from console.errors import DomainError
from console.events.record import command_actor


class Command(BaseCommand):
    help = ("Print a one-time link that lets USERNAME set a password and sign in, after putting them in --team (the "
            "user is made if needed; one who already has a password is refused). No email is sent: pass the link on. "
            "It works once, until PASSWORD_RESET_TIMEOUT (3 days by default), and a newer invite replaces it.")

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--team", required=True, help="the team they join")
        parser.add_argument("--url", default="http://127.0.0.1:8000",
                            help="the console's address as the person reaches it (default: %(default)s)")

    def handle(self, username, team, url, **options):
        row = Team.objects.filter(name=team).first()
        if row is None:
            raise CommandError(f"no team named {team!r}; make it on the Teams page or with POST /api/v1/teams")
        try:
            made = issue_invite(row, username, actor=command_actor("invite"))
        except DomainError as e:
            raise CommandError(str(e)) from None
        self.stderr.write(f"{'created' if made.created_user else 'invited'} user {username} in team {team}; the link "
                          f"works once, until {made.expires:%Y-%m-%d %H:%M} UTC")
        self.stdout.write(url.rstrip("/") + made.path)
