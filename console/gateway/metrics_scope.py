"""The metrics a member's token may read: the console's /metrics and the agents' relayed pages name every team's
deployments, so for a token of some teams (not an admin's) the samples of any other deployment are left out, as
another team's deployment is everywhere else (console/accounts/teams.py). Hosts' and the console's own series stay:
hosts are shared. Filtered off the event loop: a large fleet's page is tens of thousands of lines."""

from __future__ import annotations

import re

from console.gateway.auth import Caller
from console.gateway.fleet import FleetView

# The label a sample names its deployment with: ours, and vLLM's own (its served model is the deployment).
_NAMED = re.compile(rb'[{,](?:deployment|model_name)="((?:[^"\\]|\\.)*)"')


def visible(caller: Caller, fleet: FleetView) -> frozenset[str] | None:
    """The deployments whose samples `caller` may read; None: all of them (an admin's token)."""
    if caller.teams is None:
        return None
    return frozenset(name for name, dep in fleet.deployments.items() if caller.in_team(dep.team))


def scoped(text: bytes, names: frozenset[str] | None) -> bytes:
    """`text` (Prometheus's text format) without the samples of deployments not in `names` (None: all kept). A
    deployment deleted since is not in the fleet, so its leftover samples go too."""
    if names is None:
        return text
    kept = []
    for line in text.split(b"\n"):
        if line[:1] != b"#" and (found := _NAMED.search(line)) is not None:
            if found.group(1).decode("utf-8", "replace") not in names:
                continue
        kept.append(line)
    return b"\n".join(kept)
