from django.core.management.base import BaseCommand, CommandError

from console.errors import Invalid
from console.events.record import command_actor
from console.fleet.models import AgentCredential


class Command(BaseCommand):
    help = "Print a new agent token for host HOSTNAME (replacing any earlier one). Shown once."

    def add_arguments(self, parser):
        parser.add_argument("hostname")

    def handle(self, hostname, **options):
        try:
            _, token = AgentCredential.issue(hostname, actor=command_actor("createagenttoken"))
        except Invalid as e:  # a name the host name rule refuses, and why
            raise CommandError(str(e)) from None
        self.stdout.write(token)
