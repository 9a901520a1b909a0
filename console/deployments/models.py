from __future__ import annotations

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import models
from django.utils import timezone

import agent.engines as engines
from agent.protocol import REPLICA_STATES
from console.accounts.models import default_team_id
from console.catalog.models import Model
from console.catalog.names import NAME_VALIDATOR
from console.deployments.ceiling import check_ceiling
from console.deployments.policy import FIELDS as POLICY_FIELDS
from console.deployments.policy import validate_policy
from console.errors import Invalid


class Priority(models.TextChoices):
    CRITICAL = "critical"
    HIGH = "high"
    STANDARD = "standard"
    BATCH = "batch"


class Profile(models.TextChoices):
    UNKNOWN = "", "unknown"
    COMPUTE = "compute"
    MEMORY = "memory"
    IO = "io"


class DeploymentState(models.TextChoices):
    PENDING = "pending"
    LOADING = "loading"
    READY = "ready"
    ASLEEP = "asleep"  # nothing on a GPU, replicas asleep in host memory: a request wakes one
    IDLE = "idle"  # scaled to zero with nothing in memory: a request places one
    DEGRADED = "degraded"
    FAILED = "failed"
    UNSCHEDULABLE = "unschedulable"


class Deployment(models.Model):
    """What the operator wants served: a model, how many replicas, how important, how fast."""

    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="deployments")
    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="deployments",
                             default=default_team_id)
    # The count the scheduler decided last (between min and max); min = max is a fixed count.
    replicas = models.PositiveIntegerField(default=1)
    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField(default=1)
    gpus_per_replica = models.PositiveIntegerField(default=1, help_text="a gang of GPUs on one host")
    selector = models.JSONField(default=dict, blank=True, help_text="GPU labels it needs, e.g. {\"gpu\": \"h100\"}")
    tolerations = models.JSONField(default=dict, blank=True,
                                   help_text="host taints it may go to, e.g. {\"pool\": \"ml\"} (\"*\": any value)")
    spread = models.CharField(max_length=10, default="preferred",
                              help_text="its replicas on different GPUs, hosts, zones: preferred, required or none")
    priority = models.CharField(max_length=10, choices=Priority.choices, default=Priority.STANDARD)
    profile = models.CharField(max_length=10, choices=Profile.choices, default=Profile.UNKNOWN, blank=True,
                               help_text="what bounds it, for co-location by the latency-sensitive strategy")
    # The serving settings the memory estimate is made for (and the worker warms up at).
    dtype = models.CharField(max_length=20, blank=True, default="", help_text="serving dtype; empty: as stored")
    batch = models.PositiveIntegerField(default=1, help_text="concurrent sequences per replica")
    seq = models.PositiveIntegerField(null=True, blank=True, help_text="tokens per sequence; empty: model default")
    # Standby: replicas are loaded onto their GPUs but take no requests (the agent's `preloaded`), so
    # turning it off switches a new version in without a load gap.
    standby = models.BooleanField(default=False)
    # What runs its replicas: an engine of agent.engines, or "auto" (the console picks per host: auto_engine).
    engine = models.CharField(max_length=10, choices=engines.choices(), default=engines.AUTO)
    engine_args = models.JSONField(default=list, blank=True)  # flags for its engine (Engine.allowlist)
    # Dynamic batching in each replica: rows per forward, and how long a request waits for company.
    max_batch_size = models.PositiveIntegerField(default=8)
    max_batch_delay_ms = models.FloatField(default=5.0)
    # The estimator's breakdown at these settings, per device kind ("cpu", "cuda"), before calibration.
    estimates = models.JSONField(default=dict)
    slo_latency_ms = models.PositiveIntegerField(null=True, blank=True, help_text="p95 latency target")
    latency_critical = models.BooleanField(default=False)
    # What the agents observed (host reports), and the times the scheduler's quiet window and cooldown use.
    traffic_rps = models.FloatField(default=0.0)
    observed_p95_ms = models.FloatField(null=True, blank=True)
    violating = models.BooleanField(default=False)
    status_since = models.DateTimeField(null=True, blank=True, help_text="when it last entered or left its SLO")
    last_scale_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=20, choices=DeploymentState.choices, default=DeploymentState.PENDING)
    reason = models.TextField(blank=True)
    created = models.DateTimeField(default=timezone.now)
    # Scale to zero: with min_replicas 0, after this long without a request its replicas leave their GPUs.
    idle_timeout_s = models.PositiveIntegerField(default=300)
    # What the gateway saw: the last request, requests waiting for a ready replica (and when it last said
    # so: a count not renewed within a few seconds is stale), and its own per-process traffic figures.
    last_request_at = models.DateTimeField(null=True, blank=True)
    demand = models.PositiveIntegerField(default=0)
    demand_at = models.DateTimeField(null=True, blank=True)
    demand_since = models.DateTimeField(null=True, blank=True, help_text="when its requests started waiting")
    gateway_stats = models.JSONField(default=dict, blank=True)
    # The scheduler's answer to that demand: served | waiting | refused, and why.
    demand_status = models.CharField(max_length=10, blank=True)
    demand_reason = models.TextField(blank=True)
    # The revision of its artifacts (its model's files, its adapters') its replicas run: bumped when a PATCH finds
    # them changed; its running replicas are then restarted onto it one at a time (console/control/rollout.py).
    revision = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Every form of a deployment (the Django admin's included) validates its policy as the API does."""
        try:
            validate_policy({f: getattr(self, f) for f in POLICY_FIELDS})
        except Invalid as e:
            raise ValidationError({str(item["loc"][-1]) if item["loc"] else NON_FIELD_ERRORS: item["msg"]
                                   for item in e.errors}) from None
        self._check_ceiling()

    def _check_ceiling(self) -> None:
        """The team's priority ceiling binds the Django admin's form too, when the priority or the team changes."""
        if self.team_id is None:
            return
        stored = type(self).objects.filter(pk=self.pk).values_list("priority", "team_id").first()
        if stored is None or stored != (self.priority, self.team_id):
            try:
                check_ceiling(self.priority, self.team)
            except Invalid as e:
                raise ValidationError({"priority": str(e)}) from None

    @property
    def serving_dtype(self) -> str:
        """The dtype its replicas serve in: as chosen, else as the model is stored."""
        return self.dtype or self.model.stored_dtype

    @property
    def adapter_pool_bytes(self) -> int:
        """The device tier its adapters need: every registered adapter resident at once."""
        return sum(a.nbytes for a in self.adapters.all())


class Replica(models.Model):
    """One copy of a deployment: where the scheduler put it and what the agent reports of it."""

    TARGET_STATES = [("ready", "ready"), ("preloaded", "preloaded"), ("sleeping", "sleeping"), ("stopped", "stopped")]
    OBSERVED_STATES = [(s, s) for s in REPLICA_STATES]

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="replica_set")
    index = models.PositiveIntegerField()
    host = models.ForeignKey("fleet.Host", null=True, blank=True, on_delete=models.SET_NULL, related_name="replicas")
    gpus = models.ManyToManyField("fleet.Gpu", blank=True, related_name="replicas")
    reserved_bytes = models.PositiveBigIntegerField(default=0)
    # How reserved_bytes was derived at placement: device kind, the estimator's total, the correction.
    reservation = models.JSONField(default=dict, blank=True)
    desired_state = models.CharField(max_length=10, choices=TARGET_STATES, default="ready")
    observed_state = models.CharField(max_length=10, choices=OBSERVED_STATES, default="pending")
    measured_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    loaded_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    loading_total_bytes = models.PositiveBigIntegerField(null=True, blank=True, help_text="bytes to load in all")
    host_bytes = models.PositiveBigIntegerField(null=True, blank=True, help_text="host memory held while asleep")
    # How long its worker took to load, as it measured it (kept while it is stopped): what a request that must start
    # it again waits.
    start_seconds = models.FloatField(null=True, blank=True, help_text="its last load's seconds, measured")
    sleep_wake = models.JSONField(default=dict, blank=True, help_text="the last sleep or wake: bytes, seconds")
    adapter_stats = models.JSONField(default=list, blank=True, help_text="per adapter: tier, requests, hits")
    adapter_error = models.TextField(blank=True, help_text="why its worker refused an adapter, if it did")
    # One owner per fact: `reason` is the scheduler's (why it is placed, kept, moved, refused); the agent's
    # word on the replica (why its worker failed) is `observed_reason`, which a scheduler pass never writes.
    reason = models.TextField(blank=True, help_text="the scheduler's reason for its placement")
    observed_reason = models.TextField(blank=True, help_text="what its agent reported, e.g. why its worker failed")
    action = models.CharField(max_length=10, blank=True, help_text="the scheduler's last decision for it")
    mps_percentage = models.PositiveIntegerField(null=True, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    created = models.DateTimeField(default=timezone.now)
    # Temporal sharing: when the gateway last had a request in flight on it, and when the scheduler last
    # placed or woke it (its minimum residency counts from then).
    last_request_at = models.DateTimeField(null=True, blank=True)
    ready_since = models.DateTimeField(null=True, blank=True)
    # A rollout (console/control/rollout.py): what it keeps running until its turn comes ({"revision", "model_path",
    # "adapters": {name: path}}; {}: its deployment's current artifacts), then the pid of the worker its turn
    # restarts (the next replica waits until this one is ready under another).
    held = models.JSONField(default=dict, blank=True, help_text="the artifacts it runs until a rollout reaches it")
    restarting_pid = models.PositiveIntegerField(null=True, blank=True,
                                                 help_text="the worker a rollout restarts it from")

    class Meta:
        ordering = ["deployment__name", "index"]
        constraints = [models.UniqueConstraint(fields=["deployment", "index"], name="replica_unique_index")]

    def __str__(self) -> str:
        return f"{self.deployment.name}#{self.index}"
