import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from console.env import envsecret, envstr


class Command(BaseCommand):
    help = "Create the first admin account if there is none (password from MODELGRID_ADMIN_PASSWORD or printed once)."

    def handle(self, **options):
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            return
        username = envstr("MODELGRID_ADMIN_USER", "admin")
        given = envsecret("MODELGRID_ADMIN_PASSWORD")  # or MODELGRID_ADMIN_PASSWORD_FILE
        password = given or secrets.token_urlsafe(12)
        User.objects.create_superuser(username, "", password)
        if given:
            self.stdout.write(f"Admin account: {username} (password from MODELGRID_ADMIN_PASSWORD)")
        else:
            self.stdout.write(f"Admin account: {username} / {password}   (shown once; change it in the admin)")
