from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from console.accounts.tokens import hash_token, matches, new_token, token_prefix

LAST_USED_RESOLUTION = timedelta(minutes=1)


class HashedToken(models.Model):
    """A bearer token of which only a SHA-256 hash and a short lookup prefix are stored."""

    prefix = models.CharField(max_length=16, db_index=True)
    token_hash = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(default=timezone.now)
    last_used = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    @staticmethod
    def new_secret(kind: str) -> tuple[str, dict]:
        """A fresh plaintext token and the fields that store it."""
        token = new_token(kind)
        return token, {"prefix": token_prefix(token), "token_hash": hash_token(token)}

    @classmethod
    def find(cls, token: str, rows: models.QuerySet | None = None):
        """The row `token` belongs to (marking it used: to the minute), or None."""
        rows = cls.objects.all() if rows is None else rows
        for row in rows.filter(prefix=token_prefix(token)):
            if matches(token, row.token_hash):
                now = timezone.now()
                # A write per request cost a script creating a thousand deployments a thousand UPDATEs; "last
                # used" is for people deciding which tokens to revoke, and a minute is close enough for that.
                if row.last_used is None or now - row.last_used >= LAST_USED_RESOLUTION:
                    cls.objects.filter(pk=row.pk).update(last_used=now)
                    row.last_used = now
                return row
        return None


class Scope(models.TextChoices):
    ALL = "all", "REST API and inference"
    INFERENCE = "inference", "inference only"


class ApiToken(HashedToken):
    """A token for automation: the REST API and the inference gateway, or (scope `inference`) the gateway only."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, default="cli")
    scope = models.CharField(max_length=10, choices=Scope.choices, default=Scope.ALL)

    def __str__(self) -> str:
        return f"{self.user} / {self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, user, name: str = "cli", scope: str = Scope.ALL, actor: str = "") -> tuple[ApiToken, str]:
        """Create a token for `user`; returns the row and the plaintext, which is never stored. `actor`: who
        asked, for the timeline."""
        from console.events.record import Note, record

        token, fields = cls.new_secret("api")
        with transaction.atomic():
            row = cls.objects.create(user=user, name=name, scope=scope, **fields)
            record([Note(f"token/{user.get_username()}/{name}", "TokenCreated", f"API token {row.prefix}… "
                         f"with scope {scope} for user {user.get_username()}", actor=actor, folds=False)])
        return row, token

    @classmethod
    def authenticate(cls, token: str) -> ApiToken | None:
        return cls.find(token, cls.objects.select_related("user").filter(user__is_active=True))
