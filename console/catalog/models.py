from __future__ import annotations

from django.db import models
from django.utils import timezone

from console.accounts.models import default_team_id
from console.catalog.names import NAME_VALIDATOR


class Model(models.Model):
    """A registered model artifact with what was read from it and its memory estimate."""

    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="models", default=default_team_id)
    path = models.CharField(max_length=1000)
    architecture = models.CharField(max_length=200)
    model_type = models.CharField(max_length=100)
    task = models.CharField(max_length=20)
    stored_dtype = models.CharField(max_length=20)
    parameters = models.PositiveBigIntegerField()
    weights_bytes = models.PositiveBigIntegerField()
    estimate_bytes = models.PositiveBigIntegerField()
    estimate = models.JSONField(default=dict)
    # What its deployments and adapters are built against (agent/artifacts/shape.py): an edit keeps it while any
    # deployment uses the model. {} on rows from before it was stored: their architecture and task stand in.
    shape = models.JSONField(default=dict, blank=True)
    # What each engine's capability check refuses for it, by engine and device kind ({"vllm": {"cpu": "why"}}):
    # read from its files with the rest (agent.artifacts.capability), so deploying and placing read no files.
    engine_refusals = models.JSONField(default=dict, blank=True)
    # The files' sizes and times when they were last read: a PATCH that finds them as they were changes nothing.
    fingerprint = models.CharField(max_length=64, blank=True)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class DeviceKind(models.TextChoices):
    CPU = "cpu"  # simulated GPUs: the worker runs on the host's CPU
    CUDA = "cuda"


class MemorySample(models.Model):
    """One load of one replica: the estimate at its shape beside what its worker measured."""

    # host/replica/pid: a worker reports its measurement in every status; it is one load, kept once.
    load_key = models.CharField(max_length=200, unique=True)
    model = models.ForeignKey(Model, null=True, on_delete=models.SET_NULL, related_name="samples")
    deployment = models.CharField(max_length=63)
    family = models.CharField(max_length=50)
    architecture = models.CharField(max_length=200)
    device = models.CharField(max_length=10, choices=DeviceKind.choices)
    dtype = models.CharField(max_length=20)
    batch = models.PositiveIntegerField()
    seq = models.PositiveIntegerField()
    estimated_bytes = models.PositiveBigIntegerField(help_text="the estimator's total, before calibration")
    calibrated_bytes = models.PositiveBigIntegerField(help_text="the estimate calibration gave before this load")
    measured_bytes = models.PositiveBigIntegerField()
    estimate = models.JSONField(default=dict)
    measurement = models.JSONField(default=dict)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created", "-pk"]
        indexes = [models.Index(fields=["family", "device", "-created"])]

    def __str__(self) -> str:
        return f"{self.deployment} {self.device}: est {self.estimated_bytes} meas {self.measured_bytes}"


class Calibration(models.Model):
    """The correction later estimates of one architecture family on one device kind get."""

    family = models.CharField(max_length=50)
    device = models.CharField(max_length=10, choices=DeviceKind.choices)
    factor = models.FloatField()
    samples = models.PositiveIntegerField()
    updated = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["family", "device"]
        constraints = [models.UniqueConstraint(fields=["family", "device"], name="calibration_unique_family_device")]

    def __str__(self) -> str:
        return f"{self.family}/{self.device}: x{self.factor:.3f} from {self.samples} loads"


class Adapter(models.Model):
    """A PEFT LoRA adapter served by one deployment's base-model replicas, with what was read from it."""

    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE, related_name="adapters")
    # Its deployment's team, always: only that deployment serves it (console/accounts/teams.py).
    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="adapters",
                             default=default_team_id)
    path = models.CharField(max_length=1000)
    rank = models.PositiveIntegerField(help_text="largest LoRA rank among its modules")
    modules = models.PositiveIntegerField(help_text="weights it adapts")
    parameters = models.PositiveBigIntegerField()
    nbytes = models.PositiveBigIntegerField(help_text="bytes at the deployment's serving dtype")
    pinned = models.BooleanField(default=False, help_text="kept in the device tier, never evicted")
    fingerprint = models.CharField(max_length=64, blank=True, help_text="its files' sizes and times when read")
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
