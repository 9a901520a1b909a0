from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "console.accounts"
    label = "accounts"
    verbose_name = "API access"

    def ready(self) -> None:
        from django.conf import settings
        from django.db.models.signals import post_save

        from console.accounts.teams import join_default_team

        post_save.connect(join_default_team, sender=settings.AUTH_USER_MODEL, dispatch_uid="join_default_team")
