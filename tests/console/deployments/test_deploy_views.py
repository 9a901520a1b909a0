"""The deploy form (Models page → Deploy with settings): a deployment's name, team, engine, priority, SLO and replica
range, made through services.create_deployment() as the REST API makes one. A priority above the team's ceiling and
an engine no connected host runs are offered disabled with why, and refused beside their field when sent anyway; a
refused form keeps what was typed and stores nothing; another team's model has no deploy form."""

import pytest
from django.contrib.auth import get_user_model

from console.accounts.models import Team
from console.deployments.models import Deployment
from console.events.models import Event
from console.fleet.models import Host
from tests.console.team_scene import team_scene

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def scene(tmp_path, settings):
    """The team scene (teams a and b, each with a model and a deployment; ceilings at the default, high) and a
    connected host whose agent runs torch only."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # the scene's users, at once
    scene = team_scene(tmp_path)
    Host.objects.create(name="h1", endpoint="http://127.0.0.1:9", connected=True, engines={"torch": "2.13"})
    return scene


@pytest.fixture
def alice(client, scene):
    client.force_login(get_user_model().objects.get(username="alice"))
    return client


def form(**changes) -> dict:
    return {"name": "chat", "priority": "high", "engine": "torch", "slo_latency_ms": "250", "min_replicas": "0",
            "max_replicas": "2", "dtype": "", "batch": "1", "seq": ""} | changes


def beside(html: str, name: str) -> str:
    """What the form says with input `name`, up to the end of its label."""
    return html.split(f'name="{name}"', 1)[1].split("</label>", 1)[0]


def option(html: str, select: str, value: str) -> str:
    """The <option> tag of `value` in select `select`."""
    return beside(html, select).split(f'<option value="{value}"', 1)[1].split(">", 1)[0]


def test_the_models_page_links_each_model_to_its_deploy_form(alice):
    html = alice.get("/models/").content.decode()
    assert '<a class="button" href="/models/tiny-a/deploy/" data-deploy-form="tiny-a">Deploy with settings…</a>' in html


def test_the_form_offers_a_name_team_engine_priority_slo_and_replicas(alice):
    html = alice.get("/models/tiny-a/deploy/").content.decode()
    assert "<h1>Deploy tiny-a</h1>" in html
    assert 'name="name" required maxlength="63" autocomplete="off" value="tiny-a"' in html
    assert 'name="slo_latency_ms"' in html and 'name="min_replicas"' in html and 'name="max_replicas"' in html
    assert 'name="team"' not in html  # one team: nothing to choose
    assert "selected" in option(html, "priority", "standard")


def test_a_deployment_is_made_with_the_name_engine_priority_slo_and_replicas_given(alice):
    r = alice.post("/models/tiny-a/deploy/", form())
    assert r.status_code == 302 and r["Location"] == "/deployments/chat/"
    dep = Deployment.objects.get(name="chat")
    assert (dep.team.name, dep.engine, dep.priority, dep.slo_latency_ms) == ("team-a", "torch", "high", 250)
    assert (dep.min_replicas, dep.max_replicas, dep.replicas) == (0, 2, 1)
    assert Event.objects.get(object="deployment/chat", reason="Created").actor == "user alice"
    page = alice.get(r["Location"]).content.decode()
    assert "Deployment chat created (team team-a, priority high, p95 target 250 ms)" in page


def test_a_priority_above_the_teams_ceiling_is_offered_disabled_and_refused_beside_its_field(alice):
    html = alice.get("/models/tiny-a/deploy/").content.decode()
    assert "disabled" in option(html, "priority", "critical") and "disabled" not in option(html, "priority", "high")
    assert "above team team-a&#x27;s priority ceiling (high)" in option(html, "priority", "critical")
    r = alice.post("/models/tiny-a/deploy/", form(priority="critical"))
    html = r.content.decode()
    assert r.status_code == 422
    assert "priority critical is above team team-a&#x27;s priority ceiling (high)" in beside(html, "priority")
    assert 'value="chat"' in beside(html, "name") and 'value="250"' in beside(html, "slo_latency_ms")  # as typed
    assert not Deployment.objects.filter(name="chat").exists()


def test_an_engine_no_connected_host_runs_is_offered_disabled_with_why_and_refused(alice):
    html = alice.get("/models/tiny-a/deploy/").content.decode()
    assert "disabled" in option(html, "engine", "vllm") and "disabled" not in option(html, "engine", "torch")
    assert "no connected host runs vLLM (an agent runs it when started with --vllm-python)" in beside(html, "engine")
    r = alice.post("/models/tiny-a/deploy/", form(engine="vllm"))
    assert r.status_code == 422 and "engine vllm: no connected host runs vLLM" in beside(r.content.decode(), "engine")
    assert not Deployment.objects.filter(name="chat").exists()
    Host.objects.create(name="h2", endpoint="http://127.0.0.1:10", connected=True, engines={"torch": "", "vllm": ""})
    assert "disabled" not in option(alice.get("/models/tiny-a/deploy/").content.decode(), "engine", "vllm")
    assert alice.post("/models/tiny-a/deploy/", form(engine="vllm")).status_code == 302


@pytest.mark.parametrize("changes, field, reason", [
    ({"slo_latency_ms": "0"}, "slo_latency_ms", "greater than or equal to 1"),
    ({"slo_latency_ms": "soon"}, "slo_latency_ms", "slo_latency_ms must be a whole number"),
    ({"min_replicas": "3", "max_replicas": "1"}, "max_replicas", "max_replicas 1 is below min_replicas 3"),
    ({"name": "Chat!"}, "name", "deployment name"),
    ({"name": "chat-b"}, "name", "a deployment named &#x27;chat-b&#x27; already exists"),
])
def test_a_refused_value_is_shown_beside_its_field_and_nothing_is_stored(alice, changes, field, reason):
    r = alice.post("/models/tiny-a/deploy/", form(**changes))
    html = r.content.decode()
    assert r.status_code in (409, 422) and "Not deployed: " in html
    assert reason in html.split(f'name="{field}"', 1)[1].split("</fieldset>", 1)[0]
    assert not Deployment.objects.filter(model__name="tiny-a").exclude(name="chat-a").exists()


def test_htmx_swaps_the_refused_card_and_sends_the_browser_on_when_deployed(alice):
    r = alice.post("/models/tiny-a/deploy/", form(priority="critical"), **HTMX)
    html = r.content.decode()
    assert r.status_code == 200 and html.startswith('<section class="card policy deploy-form"')
    assert "above team team-a&#x27;s priority ceiling" in beside(html, "priority")
    r = alice.post("/models/tiny-a/deploy/", form(), **HTMX)
    assert r["HX-Redirect"] == "/deployments/chat/"


def test_a_member_of_several_teams_picks_the_team_and_the_form_follows_its_ceiling(alice):
    Team.objects.filter(name="team-b").update(priority_ceiling="critical")
    Team.objects.get(name="team-b").members.add(get_user_model().objects.get(username="alice"))
    html = alice.get("/models/tiny-a/deploy/").content.decode()
    assert "selected" in option(html, "team", "team-a") and "disabled" in option(html, "priority", "critical")
    card = alice.get("/models/tiny-a/deploy/", {"team": "team-b", "name": "mine", "priority": "critical"},
                     **HTMX).content.decode()
    assert card.startswith('<section class="card policy deploy-form"') and 'value="mine"' in beside(card, "name")
    assert "disabled" not in option(card, "priority", "critical") and "selected" in option(card, "priority", "critical")
    r = alice.post("/models/tiny-a/deploy/", form(team="team-b", priority="critical"))
    assert r.status_code == 302 and Deployment.objects.get(name="chat").team.name == "team-b"
    r = alice.post("/models/tiny-a/deploy/", form(name="chat-2", team="default"))
    assert r.status_code == 422 and "alice is not a member of a team named" in beside(r.content.decode(), "team")


def test_another_teams_model_has_no_deploy_form(alice):
    assert alice.get("/models/tiny-b/deploy/").status_code == 404
    assert alice.post("/models/tiny-b/deploy/", form()).status_code == 404
    assert not Deployment.objects.filter(name="chat").exists()


def test_one_click_deploy_still_takes_the_defaults(alice):
    r = alice.post("/models/tiny-a/deploy/")
    assert r.status_code == 302 and r["Location"] == "/deployments/tiny-a/"
    dep = Deployment.objects.get(name="tiny-a")
    assert (dep.priority, dep.engine, dep.slo_latency_ms, dep.replicas) == ("standard", "auto", None, 1)
