"""Host names in the console, by the agent's own rule (agent/protocol/hostnames.py): refused where they enter (the
API's and the commands' Invalid, the admin's field validator; hellos in console/intake/stages.py), and a system
check that reports hosts and agent tokens stored under a name the rule refuses, from before it held. Those rows
stay (their history is kept), but their agents are refused at their next hello, saying why."""

from __future__ import annotations

from django.core.checks import Tags, Warning, register
from django.core.exceptions import ValidationError

from agent.protocol.hostnames import host_name_refusal
from console.errors import Invalid


def validate_host_name(name: object, field: str = "host_name") -> None:
    """Invalid (the API's 422) naming `field` and what is wrong, unless `name` is a well-formed host name."""
    refusal = host_name_refusal(name)
    if refusal is not None:
        raise Invalid(refusal, field=field)


def host_name_validator(value: object) -> None:
    """The rule as a model field validator (the Django admin's forms)."""
    refusal = host_name_refusal(value)
    if refusal is not None:
        raise ValidationError(f"{refusal[:1].upper()}{refusal[1:]}.")


@register(Tags.database)
def stored_bad_host_names(app_configs, databases=None, **kwargs) -> list[Warning]:
    """fleet.W001 listing hosts and agent tokens whose names the rule refuses; database checks run at `migrate` and
    `check --database default`, and read nothing without a database named."""
    if not databases:
        return []
    from django.db import connections

    from console.fleet.models import AgentCredential, Host

    tables = {Host._meta.db_table, AgentCredential._meta.db_table}
    names: set[str] = set()
    for alias in databases:
        # `manage.py migrate` runs this check before it creates the tables: a new database has no names yet.
        if not tables <= set(connections[alias].introspection.table_names()):
            continue
        names |= {*Host.objects.using(alias).values_list("name", flat=True),
                  *AgentCredential.objects.using(alias).values_list("host_name", flat=True)}
    names = sorted(names)
    bad = [name for name in names if host_name_refusal(name) is not None]
    if not bad:
        return []
    return [Warning(f"{len(bad)} host name(s) stored before the host name rule held are refused by it: "
                    f"{', '.join(repr(n) for n in bad[:20])}{' …' if len(bad) > 20 else ''}; their agents are "
                    "refused at their next hello",
                    hint="issue a token for a valid name (manage.py createagenttoken NAME), restart the agent with "
                    "--name NAME and that token, then revoke the old token (DELETE /api/v1/agent-credentials/OLD)",
                    id="fleet.W001")]
