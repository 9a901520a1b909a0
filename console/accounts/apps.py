from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "console.accounts"
    label = "accounts"
    verbose_name = "API access"
