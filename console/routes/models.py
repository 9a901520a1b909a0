"""Routes: a public model name that sends requests to one or more deployments by weight (a canary split), each
branch optionally with one of its deployment's adapters, and a fallback deployment for when the chosen branch is
refused or overloaded. The gateway reads them with its fleet snapshot (console/gateway/fleet.py)."""

from __future__ import annotations

from django.db import models

from console.accounts.models import default_team_id
from console.catalog.names import NAME_VALIDATOR

MAX_BRANCHES = 16
MAX_WEIGHT = 10_000


class Route(models.Model):
    # Shares the namespace of deployments and adapters: a request's `model` names any of the three.
    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    # Only its team's tokens see and call it, and its branches and fallback are that team's deployments.
    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="routes", default=default_team_id)
    fallback = models.ForeignKey("deployments.Deployment", on_delete=models.SET_NULL, null=True, blank=True,
                                 related_name="fallback_routes")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Branch(models.Model):
    """One way a route sends traffic: a deployment (and adapter) and its weight among the route's branches."""

    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="branches")
    position = models.PositiveIntegerField()
    # A deployment or adapter that goes takes its branches with it: a route never sends traffic somewhere else
    # than it says (an adapter's branch would otherwise fall back to the base model).
    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE, related_name="route_branches")
    adapter = models.ForeignKey("catalog.Adapter", on_delete=models.CASCADE, null=True, blank=True,
                                related_name="route_branches")
    weight = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["route", "position"]
        constraints = [models.UniqueConstraint(fields=["route", "position"], name="route_branch_position")]

    def __str__(self) -> str:
        return f"{self.route.name} -> {self.target}"

    @property
    def target(self) -> str:
        """`deployment` or `deployment/adapter`, as the x-modelgrid-route header names it."""
        return f"{self.deployment.name}/{self.adapter.name}" if self.adapter_id else self.deployment.name
