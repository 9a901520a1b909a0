from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from console.accounts import expiry
from console.accounts.tokens import hash_token, legacy_prefix, matches, new_token, token_prefix
from console.scheduler.types import TIERS

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
    def lookup(cls, token: str, rows: models.QuerySet | None = None):
        """The row `token` belongs to, or None; nothing is written."""
        rows = cls.objects.all() if rows is None else rows
        # A token stored before the prefix was the secret's start is found by the prefix it was stored under.
        for row in rows.filter(prefix__in={token_prefix(token), legacy_prefix(token)}):
            if matches(token, row.token_hash):
                return row
        return None

    def mark_used(self) -> None:
        """Note that the token was just used, to the minute."""
        now = timezone.now()
        # A write per request cost a script creating a thousand deployments a thousand UPDATEs; "last
        # used" is for people deciding which tokens to revoke, and a minute is close enough for that.
        if self.last_used is None or now - self.last_used >= LAST_USED_RESOLUTION:
            type(self).objects.filter(pk=self.pk).update(last_used=now)
            self.last_used = now

    @classmethod
    def find(cls, token: str, rows: models.QuerySet | None = None):
        """The row `token` belongs to (marking it used: to the minute), or None."""
        row = cls.lookup(token, rows)
        if row is not None:
            row.mark_used()
            row.settle_prefix(token)
        return row

    def settle_prefix(self, token: str) -> None:
        """Store the prefix of this row's `token` by today's rule (tokens.token_prefix) if it was stored under the
        legacy one: lists show its secret's start from its first use on."""
        if self.prefix != token_prefix(token):
            self.prefix = token_prefix(token)
            type(self).objects.filter(pk=self.pk).update(prefix=self.prefix)


class Scope(models.TextChoices):
    ALL = "all", "REST API and inference"
    INFERENCE = "inference", "inference only"


class ApiToken(HashedToken):
    """A token for automation: the REST API and the inference gateway, or (scope `inference`) the gateway only,
    and then perhaps only some deployments. It may expire; a revoked one is kept (revoked set), so that a client
    still sending it is told when it was revoked."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, default="cli")
    scope = models.CharField(max_length=10, choices=Scope.choices, default=Scope.ALL)
    expires = models.DateTimeField(null=True, blank=True, help_text="refused from then on; empty: never expires")
    deployments = models.JSONField(default=list, blank=True,
                                   help_text="names of the deployments it may call on the gateway; empty: all")
    revoked = models.DateTimeField(null=True, blank=True)
    rpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="requests per minute; empty: none")
    tpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="tokens per minute; empty: none")

    def __str__(self) -> str:
        return f"{self.user} / {self.name} ({self.prefix}…)"

    @property
    def label(self) -> str:
        """How refusals name it: its name and prefix, never the secret."""
        return f"{self.name!r}, {self.prefix}…"

    @property
    def expired(self) -> bool:
        return self.expires is not None and self.expires <= timezone.now()

    @property
    def timeline_object(self) -> str:
        return f"token/{self.user.get_username()}/{self.name}"

    def refusal(self, now: datetime | None = None) -> str:
        """Why the token may not be used now (revoked, expired), or "" when it may."""
        if self.revoked is not None:
            return expiry.revoked(self.label, self.revoked)
        if self.expires is not None and self.expires <= (now or timezone.now()):
            return expiry.expired(self.label, self.expires)
        return ""

    @classmethod
    def issue(cls, user, name: str = "cli", scope: str = Scope.ALL, actor: str = "", expires: datetime | None = None,
              deployments: Sequence[str] = (), rpm_limit: int | None = None,
              tpm_limit: int | None = None) -> tuple[ApiToken, str]:
        """Create a token for `user`; returns the row and the plaintext, which is never stored. `actor`: who
        asked, for the timeline. `deployments` should be checked by the caller (console/accounts/services.py)."""
        from console.events.record import Note, record

        token, fields = cls.new_secret("api")
        limits = (f", expires {expiry.stamp(expires)}" if expires else "") + (
            # How many, not which: a fellow of another of the user's teams reads this event, and names it may not see
            # (the token's own page and API list them to its owner and to admins).
            f", limited to {len(deployments)} deployment(s)" if deployments else "") + (
            f", {rpm_limit} requests per minute" if rpm_limit else "") + (
            f", {tpm_limit} tokens per minute" if tpm_limit else "")
        with transaction.atomic():
            row = cls.objects.create(user=user, name=name, scope=scope, expires=expires, deployments=list(deployments),
                                     rpm_limit=rpm_limit, tpm_limit=tpm_limit, **fields)
            record([Note(row.timeline_object, "TokenCreated", f"API token {row.prefix}… with scope {scope}{limits} "
                         f"for user {user.get_username()}", actor=actor, folds=False)])
        return row, token

    def revoke(self, actor: str = "") -> bool:
        """Refuse the token from now on; False when it was revoked already (the first time stands)."""
        from console.events.record import Note, record

        now = timezone.now()
        with transaction.atomic():
            if not type(self).objects.filter(pk=self.pk, revoked__isnull=True).update(revoked=now):
                return False
            self.revoked = now
            record([Note(self.timeline_object, "TokenRevoked", f"API token {self.prefix}… of user "
                         f"{self.user.get_username()} revoked", actor=actor, folds=False)])
        return True

    @classmethod
    def verify(cls, token: str, now: datetime | None = None) -> tuple[ApiToken | None, str]:
        """The row of an active user's token and why it is refused ("" when it is not: then it is marked used);
        (None, "") for a token nobody has."""
        row = cls.lookup(token, cls.objects.select_related("user").filter(user__is_active=True))
        if row is None:
            return None, ""
        why = row.refusal(now)
        if not why:
            row.mark_used()
            row.settle_prefix(token)
        return row, why

    @classmethod
    def authenticate(cls, token: str) -> ApiToken | None:
        """The row of a token that may be used now, or None."""
        row, why = cls.verify(token)
        return None if why else row


DEFAULT_TEAM = "default"
DEFAULT_TEAM_FIELDS = {"priority_ceiling": "critical"}  # the team everything was in before ceilings: unbounded


class QuotaPeriod(models.TextChoices):
    DAY = "day"
    WEEK = "week"
    MONTH = "month"


class Team(models.Model):
    """Who owns models, deployments and adapters. A user acts within the teams they are a member of (admins within
    all); a plain many-to-many, because membership carries nothing else yet (no roles: admins are is_staff)."""

    name = models.CharField(max_length=63, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="teams", blank=True)
    created = models.DateTimeField(default=timezone.now)
    # Limits at the gateway (console/gateway/limits.py), counted across console processes; null: none.
    rpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="requests per minute; empty: none")
    tpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="tokens per minute; empty: none")
    token_quota = models.PositiveBigIntegerField(null=True, blank=True,
                                                 help_text="tokens per quota period; empty: none")
    quota_period = models.CharField(max_length=5, choices=QuotaPeriod.choices, default=QuotaPeriod.MONTH,
                                    help_text="UTC calendar periods: a day, a week from Monday, a month")
    priority_ceiling = models.CharField(max_length=10, choices=[(t, t) for t in TIERS], default="high",
                                        help_text="the highest priority its deployments may have")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def timeline_object(self) -> str:
        return f"team/{self.name}"


def default_team_id() -> int:
    """The team that everything made before teams belongs to, and new users join (made on first use)."""
    return Team.objects.get_or_create(name=DEFAULT_TEAM, defaults=DEFAULT_TEAM_FIELDS)[0].pk


class LimitCounter(models.Model):
    """Requests and tokens counted in one window (a minute, a quota period) under one key (a token's, a team's),
    summed over every console process: each adds what it counted since its last sync (console/accounts/counters.py)."""

    key = models.CharField(max_length=40)
    start = models.BigIntegerField(help_text="the window's start, seconds since the epoch (UTC)")
    until = models.BigIntegerField(help_text="the window's end: kept a while after, then deleted")
    requests = models.BigIntegerField(default=0)
    tokens = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key", "start"], name="limit_counter_window")]
        indexes = [models.Index(fields=["until"], name="limit_counter_until")]

    def __str__(self) -> str:
        return f"{self.key} from {self.start}: {self.requests} requests, {self.tokens} tokens"


class LimitHold(models.Model):
    """The tokens one console process has reserved for its requests in flight in one window (a LimitCounter's), as
    of its last sync: replaced whole at each, and counted by the other consoles while it keeps syncing."""

    console = models.CharField(max_length=100, help_text="the console process (host:pid:random)")
    key = models.CharField(max_length=40)
    start = models.BigIntegerField(help_text="the window's start, seconds since the epoch (UTC)")
    until = models.BigIntegerField(help_text="the window's end")
    tokens = models.BigIntegerField(default=0)
    seen = models.FloatField(help_text="when that console last synced it, seconds since the epoch")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["console", "key", "start"], name="limit_hold_window")]
        indexes = [models.Index(fields=["seen"], name="limit_hold_seen")]

    def __str__(self) -> str:
        return f"{self.console} holds {self.tokens} tokens of {self.key} from {self.start}"
