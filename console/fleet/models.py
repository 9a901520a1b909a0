from __future__ import annotations

import hashlib
import hmac

from django.conf import settings
from django.db import models, transaction

from console.accounts.models import HashedToken
from console.changes import revoke_links
from console.fleet import lifecycle
from console.fleet.hostnames import host_name_validator, validate_host_name


class Host(models.Model):
    """A GPU host, known from its agent's hello and reports."""

    name = models.CharField(max_length=200, unique=True, validators=[host_name_validator])
    endpoint = models.CharField(max_length=300, blank=True, help_text="Base URL of the agent's inference server")
    agent_version = models.CharField(max_length=50, blank=True)
    # Liveness is a lease, as for Kubernetes nodes: every message from the agent renews it (last_seen). A host
    # whose lease lapsed or whose link closed is `unknown` (since unknown_since): it keeps its replicas but gets
    # no new ones; only after the eviction timeout are they re-placed (evicted_at), at a bounded rate.
    connected = models.BooleanField(default=False)
    last_seen = models.DateTimeField(null=True, blank=True)
    unknown_since = models.DateTimeField(null=True, blank=True)
    evicted_at = models.DateTimeField(null=True, blank=True)
    # Each hello starts a new link epoch; only the link of the current epoch may mark the host unknown.
    link_epoch = models.PositiveBigIntegerField(default=0)
    # Desired-state generation pushed to the agent, and the one it acknowledged applying.
    generation = models.PositiveBigIntegerField(default=0)
    acked_generation = models.PositiveBigIntegerField(default=0)
    desired_digest = models.CharField(max_length=64, blank=True)
    labels = models.JSONField(default=dict, blank=True, help_text="labels of all its GPUs, e.g. zone=east")
    # Only deployments that tolerate every taint are placed on its GPUs: a pool kept for them.
    taints = models.JSONField(default=dict, blank=True, help_text="e.g. pool=ml: only deployments tolerating it")
    # The engines its agent runs replicas with, name -> version, from its hello: each is a label of its GPUs too,
    # engine.NAME=yes, which a deployment's engine selects (console/fleet/labels.py).
    engines = models.JSONField(default=dict, blank=True)
    ram_free_bytes = models.PositiveBigIntegerField(null=True, blank=True, help_text="room for sleeping replicas")
    # Per deployment served here: request rate, latency percentiles, errors (the agent's recent window).
    serving = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @classmethod
    def named(cls, name: str) -> models.QuerySet:
        """The host called `name` (none for a name with a NUL: no host has one, and PostgreSQL refuses it)."""
        return cls.objects.none() if "\x00" in name else cls.objects.filter(name=name)

    @property
    def lifecycle(self) -> str:
        """connected | unknown (lease lapsed, replicas kept) | offline (evicted: its replicas were re-placed)."""
        return lifecycle.state(self.connected, self.unknown_since, self.evicted_at)


class HostDesired(models.Model):
    """A host's desired replicas at its generation, as pushed: built by the scheduler pass only for hosts whose
    replicas changed, so a push or a reconnect sends it without rebuilding. A table of its own so that no
    query that joins a host (every replica's) ever carries it along."""

    host = models.OneToOneField(Host, primary_key=True, on_delete=models.CASCADE, related_name="desired")
    replicas = models.JSONField(default=list)

    def __str__(self) -> str:
        return f"desired state of {self.host_id}"


class Gpu(models.Model):
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveIntegerField()
    uuid = models.CharField(max_length=100)
    name = models.CharField(max_length=200)
    total_bytes = models.PositiveBigIntegerField(default=0)
    used_bytes = models.PositiveBigIntegerField(default=0)
    # Of used_bytes, what ModelGrid's own workers on this host hold (loading, serving, draining, waking);
    # null when the agent does not say. The rest is foreign.
    own_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    utilization = models.FloatField(null=True, blank=True)
    simulated = models.BooleanField(default=False)

    class Meta:
        ordering = ["host__name", "index"]
        constraints = [models.UniqueConstraint(fields=["host", "index"], name="gpu_unique_index_per_host")]

    def __str__(self) -> str:
        return f"{self.host.name}/{self.index}"

    @property
    def free_bytes(self) -> int:
        return max(self.total_bytes - self.used_bytes, 0)


def foreign_bytes(used: int, own: int | None, measured: int) -> int:
    """What other processes hold on a GPU: its reading less what ModelGrid's own workers hold. The agent says
    that (`own`: loading, serving, draining and waking workers alike, whatever replica rows point here now);
    for an agent that does not, `measured` stands in: what the replicas placed here measured."""
    return max(used - (own if own is not None else measured), 0)


class AgentCredential(HashedToken):
    """The token an agent presents for one host name."""

    host_name = models.CharField(max_length=200, unique=True, validators=[host_name_validator])

    def __str__(self) -> str:
        return f"agent {self.host_name} ({self.prefix}…)"

    @classmethod
    def issue(cls, host_name: str, actor: str = "") -> tuple[AgentCredential, str]:
        """Create or rotate the credential for `host_name`; returns the plaintext once. `actor`: who asked. Invalid
        (field host_name) for a name the host name rule refuses."""
        from console.events.record import Note, host_object, record

        validate_host_name(host_name)
        token, fields = cls.new_secret("agent")
        with transaction.atomic():
            row, created = cls.objects.update_or_create(host_name=host_name, defaults=fields)
            record([Note(host_object(host_name), "TokenCreated" if created else "TokenRotated",
                         f"agent token {row.prefix}… {'issued' if created else 'issued, replacing the one before'}",
                         actor=actor, host=host_name, folds=False)])
            host = Host.objects.filter(name=host_name).values_list("pk", flat=True).first()
            if not created and host is not None:
                transaction.on_commit(lambda: revoke_links(host))
        return row, token

    @classmethod
    def authenticate(cls, token: str) -> AgentCredential | None:
        return cls.find(token)

    @property
    def gateway_secret(self) -> str:
        """What the console's gateway presents to this host's agent. Derived from SECRET_KEY and the agent
        token's hash: nothing more is stored, every console process knows it, and it rotates with the token."""
        message = f"gateway:{self.host_name}:{self.token_hash}".encode()
        return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()


class PlacementSettings(models.Model):
    """Fleet-wide placement settings changed at run time (one row); until someone sets them, the environment's
    (MODELGRID_STRATEGY) hold."""

    strategy = models.CharField(max_length=20)
    changed = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"placement: {self.strategy}"

    @classmethod
    def strategy_now(cls) -> tuple[str, bool]:
        """The strategy the scheduler plans with, and whether it was set at run time (else it is the setting's)."""
        found = cls.objects.filter(pk=1).values_list("strategy", flat=True).first()
        return (found, True) if found else (settings.MODELGRID_STRATEGY, False)
