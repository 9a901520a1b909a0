"""Inviting a person from the console: an admin makes a user in a team (or takes one with no password) and gets a
one-time link; the person opens it, sets a password under the password validators, and signs in. Members are refused
with 403 saying only admins invite; an expired link is refused saying when, and any other that does not work
(used, replaced, forged, naming nobody) alike, telling nobody who has an account; the invite and its use
are on the team's timeline with who."""

from datetime import datetime, timedelta

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.contrib.auth.tokens import default_token_generator

from console.accounts.models import Team
from console.events.models import Event
from tests.console.team_scene import team_scene

pytestmark = pytest.mark.django_db
NEW_PASSWORD = "a-fine-new-password"


@pytest.fixture
def scene(tmp_path):
    return team_scene(tmp_path)


def as_user(client, name: str):
    client.force_login(get_user_model().objects.get(username=name))
    return client


def invited(client, user: str = "nina", team: str = "team-a") -> str:
    """The link path the admin's Invite page answers with."""
    r = as_user(client, "root").post(f"/teams/{team}/invite/", {"user": user})
    assert r.status_code == 200, r.content.decode()
    link = r.content.decode().split('id="invite-url"', 1)[1].split('value="', 1)[1].split('"', 1)[0]
    client.logout()
    return link.removeprefix("http://testserver")


def set_password(client, link: str, first: str = NEW_PASSWORD, second: str = NEW_PASSWORD):
    """Open the link (it moves to a page without the token), then post the form."""
    opened = client.get(link)
    assert opened.status_code == 302 and opened["Location"].endswith("/set-password/")
    return client.post(opened["Location"], {"new_password1": first, "new_password2": second})


def test_the_teams_page_offers_admins_an_invite_for_each_team(client, scene):
    html = as_user(client, "root").get("/teams/").content.decode()
    assert 'href="/teams/team-a/invite/" data-invite="team-a"' in html
    assert "data-invite=" not in as_user(client, "alice").get("/teams/").content.decode()


def test_an_admin_invites_a_new_person_into_a_team_and_gets_a_one_time_link(client, scene):
    link = invited(client)
    assert link.startswith("/accounts/invite/")
    nina = get_user_model().objects.get(username="nina")
    assert not nina.has_usable_password()
    assert list(nina.teams.values_list("name", flat=True)) == ["team-a"]  # that team only, not also default
    event = Event.objects.get(object="team/team-a", reason="Invited")
    assert event.actor == "user root" and "nina (a new user) invited to team team-a" in event.message


def test_the_person_sets_a_password_with_the_link_and_signs_in(client, scene):
    link = invited(client)
    r = set_password(client, link)
    assert r.status_code == 302 and r["Location"] == "/accounts/login/"
    assert "Password set. Sign in as nina." in client.get(r["Location"]).content.decode()
    assert authenticate(username="nina", password=NEW_PASSWORD) is not None
    event = Event.objects.get(object="team/team-a", reason="InviteAccepted")
    assert event.actor == "user nina" and "nina set a password from their invite" in event.message
    audit = as_user(client, "root").get("/audit/?kind=team").content.decode()
    assert "InviteAccepted" in audit and "Invited" in audit


def test_a_password_the_validators_refuse_is_said_beside_its_field_and_the_link_still_works(client, scene):
    link = invited(client)
    r = set_password(client, link, "short", "short")
    html = r.content.decode()
    assert r.status_code == 422
    assert "This password is too short" in html.split('name="new_password2"', 1)[1].split("</label>", 1)[0]
    r = client.post(link.rsplit("/", 2)[0] + "/set-password/", {"new_password1": NEW_PASSWORD,
                                                                  "new_password2": NEW_PASSWORD + "x"})
    assert r.status_code == 422 and "didn’t match" in r.content.decode()
    assert not get_user_model().objects.get(username="nina").has_usable_password()
    assert set_password(client, link).status_code == 302


def _refusal(r) -> tuple[int, str]:
    return r.status_code, r.content.decode().split("data-refusal>", 1)[1].split("</p>", 1)[0]


def test_a_used_link_is_refused_saying_it_may_have_been_used(client, scene):
    link = invited(client)
    set_password(client, link)
    status, refusal = _refusal(client.get(link))
    assert status == 404
    assert "it was used already (then sign in with the password you set)" in refusal
    assert "nina" not in refusal  # a forged link learns no user's name


def test_a_forged_link_says_nothing_of_whom_it_names_or_whether_they_have_a_password(client, scene):
    from django.utils.encoding import force_bytes
    from django.utils.http import urlsafe_base64_encode

    invited(client)  # nina: no password yet
    forged = {name: f"/accounts/invite/{urlsafe_base64_encode(force_bytes(pk))}/c2h-0123456789abcdef0123456789ab/"
              for name, pk in get_user_model().objects.filter(username__in=["alice", "nina"]).values_list(
                  "username", "pk")}
    nobody = "/accounts/invite/OTk5OQ/c2h-0123456789abcdef0123456789ab/"
    answers = {_refusal(client.get(path)) for path in [forged["alice"], forged["nina"], nobody]}
    assert len(answers) == 1, answers  # one status, one refusal: whether an account exists is not told


def test_an_expired_link_is_refused_saying_when(client, scene, monkeypatch):
    link = invited(client)
    later = datetime.now() + timedelta(days=4)  # past PASSWORD_RESET_TIMEOUT (3 days)
    monkeypatch.setattr(default_token_generator, "_now", lambda: later)
    r = client.get(link)
    assert r.status_code == 410 and "This link expired at " in r.content.decode()
    assert "Ask an admin for a new one" in r.content.decode()


def test_a_newer_invite_replaces_the_older_link(client, scene):
    first = invited(client)
    second = invited(client)
    assert first != second
    r = client.get(first)
    assert r.status_code == 404 and "a newer invite replaced it" in r.content.decode()
    assert set_password(client, second).status_code == 302
    said = list(Event.objects.filter(reason="Invited").order_by("id").values_list("message", flat=True))
    assert "(a new user)" in said[0] and "(a user with no password until now)" in said[1]


def test_a_link_that_names_nobody_is_not_found(client, scene):
    r = client.get("/accounts/invite/OTk5OQ/abc-def/")
    assert r.status_code == 404 and "or it was cut short" in r.content.decode()
    r = client.get("/accounts/invite/OTk5OQ/set-password/")
    assert r.status_code == 404


def test_someone_who_signs_in_already_or_a_bad_name_is_refused_beside_the_field(client, scene):
    admin = as_user(client, "root")
    r = admin.post("/teams/team-b/invite/", {"user": "alice"})
    html = r.content.decode()
    assert r.status_code == 409
    assert "alice already has a password and signs in with it" in html.split('name="user"', 1)[1]
    assert not Team.objects.get(name="team-b").members.filter(username="alice").exists()
    r = admin.post("/teams/team-b/invite/", {"user": "ann smith"})
    assert r.status_code == 422 and "has characters a user name may not have" in r.content.decode()
    assert not get_user_model().objects.filter(username="ann smith").exists()


def test_an_api_only_user_is_invited_and_keeps_their_teams(client, scene):
    users = get_user_model().objects
    bot = users.create_user("ops-bot")  # as createapitoken makes them: no password
    link = invited(client, "ops-bot", "team-b")
    assert sorted(bot.teams.values_list("name", flat=True)) == ["default", "team-b"]
    assert set_password(client, link).status_code == 302
    assert authenticate(username="ops-bot", password=NEW_PASSWORD) is not None


def test_a_member_is_refused_with_403_saying_only_admins_invite(client, scene):
    alice = as_user(client, "alice")
    for r in (alice.get("/teams/team-a/invite/"), alice.post("/teams/team-a/invite/", {"user": "nina"}),
              alice.post("/teams/team-b/invite/", {"user": "nina"})):
        html = r.content.decode()
        assert r.status_code == 403 and "only admins (staff users) invite people" in html
        assert "team-b" not in html and "team-a" not in html
    assert not get_user_model().objects.filter(username="nina").exists()


def test_an_unknown_team_is_not_found(client, scene):
    assert as_user(client, "root").get("/teams/nowhere/invite/").status_code == 404
