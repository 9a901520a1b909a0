"""console/accounts/invites.py and `manage.py invite`: an invite from a shell prints the whole link, which works
once; the shell is on the team's timeline as who invited; a team or a person that cannot be invited is refused."""

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from console.accounts.models import Team
from console.events.models import Event

pytestmark = pytest.mark.django_db


def test_manage_py_invite_prints_a_link_that_lets_the_person_set_a_password(client):
    Team.objects.create(name="search")
    out, err = StringIO(), StringIO()
    call_command("invite", "nina", "--team", "search", "--url", "https://grid.example.com/", stdout=out, stderr=err)
    link = out.getvalue().strip()
    assert link.startswith("https://grid.example.com/accounts/invite/")
    assert "created user nina in team search" in err.getvalue() and "works once, until" in err.getvalue()
    opened = client.get(link.removeprefix("https://grid.example.com"))
    assert opened.status_code == 302
    password = "a-fine-new-password"
    r = client.post(opened["Location"], {"new_password1": password, "new_password2": password})
    assert r.status_code == 302 and get_user_model().objects.get(username="nina").has_usable_password()
    assert Event.objects.get(object="team/search", reason="Invited").actor.startswith("manage.py invite (")


def test_manage_py_invite_refuses_an_unknown_team_and_a_person_with_a_password():
    with pytest.raises(CommandError, match="no team named 'nowhere'"):
        call_command("invite", "nina", "--team", "nowhere", stdout=StringIO(), stderr=StringIO())
    get_user_model().objects.create_user("ann", password="a-long-password")
    Team.objects.create(name="search")
    with pytest.raises(CommandError, match="ann already has a password and signs in with it"):
        call_command("invite", "ann", "--team", "search", stdout=StringIO(), stderr=StringIO())
    assert not Team.objects.get(name="search").members.filter(username="ann").exists()
