import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from console.env import envstr


class Command(BaseCommand):
    help = "Create the first admin account if there is none (password from MODELGRID_ADMIN_PASSWORD or printed once)."

    def handle(self, **options):
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            return
        username = envstr("MODELGRID_ADMIN_USER", "admin")
        password = envstr("MODELGRID_ADMIN_PASSWORD")
        User.objects.create_superuser(username, "", password or (password := secrets.token_urlsafe(12)))
        if envstr("MODELGRID_ADMIN_PASSWORD"):
            self.stdout.write(f"Admin account: {username} (password from MODELGRID_ADMIN_PASSWORD)")
        else:
            self.stdout.write(f"Admin account: {username} / {password}   (shown once; change it in the admin)")
