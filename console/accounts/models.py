from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from console.accounts.tokens import hash_token, matches, new_token, token_prefix


class ApiToken(models.Model):
    """A REST API token for automation; only its hash is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, default="cli")
    prefix = models.CharField(max_length=16, db_index=True)
    token_hash = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(default=timezone.now)
    last_used = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.user} / {self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, user, name: str = "cli") -> tuple[ApiToken, str]:
        """Create a token for `user`; returns the row and the plaintext, which is never stored."""
        token = new_token("api")
        row = cls.objects.create(user=user, name=name, prefix=token_prefix(token), token_hash=hash_token(token))
        return row, token

    @classmethod
    def authenticate(cls, token: str) -> ApiToken | None:
        for row in cls.objects.select_related("user").filter(prefix=token_prefix(token)):
            if matches(token, row.token_hash) and row.user.is_active:
                cls.objects.filter(pk=row.pk).update(last_used=timezone.now())
                return row
        return None
