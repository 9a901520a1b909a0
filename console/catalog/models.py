from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

NAME_VALIDATOR = RegexValidator(
    r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$",
    "Use 1-63 lowercase letters, digits, '.', '_' or '-', starting and ending with a letter or digit.",
)


class Model(models.Model):
    """A registered model artifact with what was read from it and its memory estimate."""

    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    path = models.CharField(max_length=1000)
    architecture = models.CharField(max_length=200)
    model_type = models.CharField(max_length=100)
    task = models.CharField(max_length=20)
    stored_dtype = models.CharField(max_length=20)
    parameters = models.PositiveBigIntegerField()
    weights_bytes = models.PositiveBigIntegerField()
    estimate_bytes = models.PositiveBigIntegerField()
    estimate = models.JSONField(default=dict)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
