"""Host names enter by the agent's hello, `createagenttoken`, `up --agent-name`, the Django admin and the API
(tests/console/accounts/test_agent_credential_api.py); each refuses a bad one with its reason, by one rule
(agent/protocol/hostnames.py). The probe: `gpu-а` (a Cyrillic `а`) and names holding `/`, `?` or `#` were taken."""

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from console.fleet.models import AgentCredential, Host

pytestmark = pytest.mark.django_db
LOOK_ALIKE = "gpu-\u0430"  # Cyrillic small a


@pytest.fixture
def admin_client(client):
    get_user_model().objects.create_superuser("root", password="a-long-password")
    client.login(username="root", password="a-long-password")
    return client


@pytest.mark.parametrize("name, said", [(LOOK_ALIKE, "CYRILLIC SMALL LETTER A"), ("gpu/1", "a path separator"),
                                        ("gpu#1", "fragment mark")])
def test_createagenttoken_refuses_a_bad_host_name_saying_why_and_issues_nothing(name, said):
    with pytest.raises(CommandError, match=said):
        call_command("createagenttoken", name, stdout=StringIO())
    assert not AgentCredential.objects.exists()


def test_up_refuses_a_bad_agent_name_as_it_reads_its_arguments():
    from console.control.management.commands.up import Command

    parser = Command().create_parser("manage.py", "up")  # parsed only: a name it took would start a console
    with pytest.raises(CommandError, match="agent-name.*a URL's query mark"):
        parser.parse_args(["--agent-name", "gpu?1"])


def test_the_admin_refuses_renaming_an_agent_token_or_a_host_to_a_bad_name(admin_client):
    row, _ = AgentCredential.issue("gpu-1")
    host = Host.objects.create(name="gpu-1")
    answer = admin_client.post(f"/admin/fleet/agentcredential/{row.pk}/change/", {"host_name": LOOK_ALIKE})
    assert answer.status_code == 200 and "CYRILLIC SMALL LETTER A" in str(answer.context["adminform"].form.errors)
    answer = admin_client.post(f"/admin/fleet/host/{host.pk}/change/", {"name": "gpu/1", "gpus-TOTAL_FORMS": "0",
                                                                         "gpus-INITIAL_FORMS": "0"})
    assert answer.status_code == 200 and "a path separator" in str(answer.context["adminform"].form.errors)
    assert AgentCredential.objects.get().host_name == "gpu-1" and Host.objects.get().name == "gpu-1"


def test_hosts_and_tokens_stored_under_bad_names_before_the_rule_are_reported_by_the_checks():
    from console.fleet.hostnames import stored_bad_host_names

    AgentCredential.issue("gpu-1")
    _, fields = AgentCredential.new_secret("agent")
    AgentCredential.objects.create(host_name=LOOK_ALIKE, **fields)  # as the old rule let it in
    Host.objects.create(name="gpu/2")
    [warning] = stored_bad_host_names(None, databases=["default"])
    assert warning.id == "fleet.W001"
    assert LOOK_ALIKE in warning.msg and "gpu/2" in warning.msg and "gpu-1" not in warning.msg.replace(LOOK_ALIKE, "")
    assert "createagenttoken" in warning.hint
    assert stored_bad_host_names(None) == []  # no database named: nothing read (checks run before one exists)
