"""The deploy form (Models page → Deploy with settings): a deployment's name, team, engine, priority, SLO, replica
range and serving shape, read into what services.create_deployment() takes. The policy fields are read by the SLO
form's own parser (policy_form.py) and checked by the policy (policy.py) and the team's priority ceiling in the
service, so the form refuses what the REST API refuses, naming the same field. What only the form knows: which
engines a connected host runs (the others are offered disabled, with why, and refused) and which priorities the
team's ceiling leaves."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import agent.engines as engines
from console.accounts.models import Team
from console.deployments.policy_form import parse_policy_form
from console.errors import Invalid
from console.fleet.models import Host
from console.forms import checked, whole_number
from console.scheduler.types import TIER_RANK, TIERS

# The policy fields the form has; the others keep their defaults (the deployment's page changes them later).
POLICY_FIELDS = ("priority", "min_replicas", "max_replicas", "slo_latency_ms", "latency_critical", "engine")
# What the form shows, typed (or defaulted) as text.
FIELDS = ("name", "team", *POLICY_FIELDS, "dtype", "batch", "seq", "device")
# (value, name, what the option says)
ENGINES = ((engines.AUTO, engines.AUTO, engines.AUTO_LABEL),
           *((e.name, e.label, f"{e.label} (built in)" if e is engines.BUILTIN else e.label)
             for e in engines.ENGINES.values()))
DEFAULT_PRIORITY = "standard"


@dataclass(frozen=True)
class Choice:
    """An option of a select: offered, or disabled with why."""

    value: str
    label: str
    why: str = ""

    @property
    def available(self) -> bool:
        return not self.why


@dataclass(frozen=True)
class DeployRequest:
    """What a submitted form asks for: create_deployment()'s arguments."""

    name: str
    team: str
    serving: dict[str, Any]
    policy: dict[str, Any]


def running_engines() -> set[str]:
    """The engines some connected host runs (an agent that names none runs the built-in one)."""
    running: set[str] = set()
    for named in Host.objects.filter(connected=True).values_list("engines", flat=True):
        running |= set(named or {engines.BUILTIN.name: ""})
    return running


def engine_choices(running: set[str] | None = None) -> list[Choice]:
    """auto always; an engine when a connected host runs it, else disabled saying so."""
    running = running_engines() if running is None else running
    return [Choice(value, label, "" if value == engines.AUTO or value in running else
                   f"no connected host runs {name}" + _started_with(value))
            for value, name, label in ENGINES]


def _started_with(name: str) -> str:
    program = engines.ENGINES[name].program
    return f" (an agent runs it when started with {program.flag})" if program is not None else ""


def check_engine(engine: str, running: set[str] | None = None) -> None:
    """Refuse, naming the engine field, an engine the form offered disabled."""
    for choice in engine_choices(running):
        if choice.value == engine and not choice.available:
            raise Invalid(f"engine {engine}: {choice.why}; choose auto, or start such a host first",
                          field="engine")


def priority_choices(team: Team) -> list[Choice]:
    """The tiers, those above `team`'s priority ceiling disabled with why (ceiling.check_ceiling refuses them)."""
    ceiling = TIER_RANK.get(team.priority_ceiling, len(TIERS))
    return [Choice(tier, tier, "" if TIER_RANK[tier] >= ceiling else
                   f"above team {team.name}'s priority ceiling ({team.priority_ceiling}); an admin can raise it")
            for tier in TIERS]


def default_priority(team: Team) -> str:
    """standard, or the team's ceiling when that is lower."""
    return max(DEFAULT_PRIORITY, team.priority_ceiling, key=lambda t: TIER_RANK.get(t, len(TIERS)))


def initial(name: str, team: Team) -> dict[str, Any]:
    """The form's values before anything is typed: one replica at the model's stored shape, no SLO."""
    return {"name": name, "team": team.name, "priority": default_priority(team), "min_replicas": "1",
            "max_replicas": "1", "slo_latency_ms": "", "latency_critical": False, "engine": "auto", "dtype": "",
            "batch": "1", "seq": "", "device": "cuda"}


def typed(form: Mapping[str, str], base: dict[str, Any]) -> dict[str, Any]:
    """`base` with what was typed into the form, to show again (beside a refusal, or after the team changed)."""
    out = base | {f: form[f] for f in FIELDS if f in form and f != "latency_critical"}
    if "priority" in form or "engine" in form:  # a form was sent: an unticked box is not sent at all
        out["latency_critical"] = checked(form, "latency_critical")
    return out


def parse(form: Mapping[str, str]) -> DeployRequest:
    """The deployment a submitted form asks for; Invalid naming the field when a number is not one. Fields not sent
    keep their defaults; `replicas` alone (the one-click form) fixes the count."""
    given = {f for f in POLICY_FIELDS if f in form} - {"latency_critical"}
    changes = {f: v for f, v in parse_policy_form(form).items()
               if f in given or (f == "latency_critical" and "priority" in form)}
    if not changes.get("priority"):
        changes.pop("priority", None)
    replicas = whole_number(form.get("replicas"), "replicas")
    if replicas is not None:
        changes["replicas"] = replicas
    serving = {"dtype": form.get("dtype") or None, "batch": whole_number(form.get("batch"), "batch") or 1,
               "seq": whole_number(form.get("seq"), "seq")}
    return DeployRequest(form.get("name", "").strip(), form.get("team", "").strip(), serving, changes)
