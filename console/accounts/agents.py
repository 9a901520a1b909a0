"""The agents' tokens, managed by staff from the API and the Tokens page: list them (never the secrets), issue or
rotate one for a host name, revoke one. Rotating or revoking ends the links the host's agent made with the old
token, on every console process (console/control/layer.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import QuerySet

from console.accounts.services import require_admin
from console.changes import revoke_links
from console.errors import Invalid, NotFound
from console.events.record import Note, host_object, record
from console.fleet.hostnames import validate_host_name
from console.fleet.models import AgentCredential, Host

MAX_HOST_NAME = 200  # Host.name, AgentCredential.host_name
MANAGE = "manage agent tokens"


@dataclass(frozen=True)
class AgentToken:
    """One host's agent token as lists show it."""

    host_name: str
    prefix: str
    created: datetime
    last_used: datetime | None
    connected: bool


def credentials(requester, q: str = "") -> QuerySet[AgentCredential]:
    """The agents' tokens by host name, those whose host name contains `q`; staff only."""
    require_admin(requester, MANAGE)
    rows = AgentCredential.objects.order_by("host_name")
    if "\x00" in q:  # no host name holds a NUL, and PostgreSQL refuses one in a query
        return rows.none()
    return rows.filter(host_name__icontains=q) if q else rows


def shown(rows) -> list[AgentToken]:
    """`rows` with whether each host's agent is connected now."""
    rows = list(rows)
    connected = set(Host.objects.filter(name__in=[r.host_name for r in rows], connected=True)
                    .values_list("name", flat=True))
    return [AgentToken(r.host_name, r.prefix, r.created, r.last_used, r.host_name in connected) for r in rows]


def issue(requester, host_name: str, actor: str = "") -> tuple[AgentCredential, str, bool]:
    """Issue the agent token of `host_name`, or rotate it; returns the row, the plaintext (shown once) and whether it
    replaced one."""
    require_admin(requester, MANAGE)
    _check_host_name(host_name)
    rotated = AgentCredential.objects.filter(host_name=host_name).exists()
    row, token = AgentCredential.issue(host_name, actor=actor)
    return row, token, rotated


def revoke(requester, host_name: str, actor: str = "") -> None:
    """Delete the agent token of `host_name`: its agent is refused from now on and its links end."""
    require_admin(requester, MANAGE)
    with transaction.atomic():
        row = AgentCredential.objects.select_for_update().filter(host_name=host_name).first()
        if row is None:
            raise NotFound(f"no agent token for host {host_name[:MAX_HOST_NAME]!r}; GET /api/v1/agent-credentials "
                           "lists them")
        row.delete()
        record([Note(host_object(host_name), "TokenRevoked", f"agent token {row.prefix}… revoked: the agent is "
                     "refused until it is given a new one", actor=actor, host=host_name, folds=False)])
        host = Host.objects.filter(name=host_name).values_list("pk", flat=True).first()
        if host is not None:
            transaction.on_commit(lambda: revoke_links(host))


def _check_host_name(name: str) -> None:
    if not name:
        raise Invalid("host_name is empty; give the name its agent reports (its --name, else the machine's "
                      "hostname)", field="host_name")
    validate_host_name(name)  # the host name rule (agent/protocol/hostnames.py)
