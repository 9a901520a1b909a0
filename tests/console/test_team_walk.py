"""Team scope, walked: every URL pattern of the console's URL conf (its pages, their htmx fragments, the charts,
the REST API under /api/v1/ with each GET operation's query parameters from the OpenAPI schema, the usage CSV) is
requested as bob of team b, and no answer names anything of team a's. The patterns come from the URL conf itself,
so a page added later is walked without a change here; one whose parameters the walk cannot fill fails
test_every_url_pattern_is_walked, unless it is listed in UNWALKED with the reason it holds no team's data.

Each path parameter is filled from the scene (tests/console/team_scene.py shared_scene) three ways: with team b's
own object, with team a's (which must answer exactly as the third does), and with a name nobody has."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import product
from urllib.parse import quote, urlencode

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from console.api import api
from tests.console.team_scene import PASSWORD, SharedScene, shared_scene

# Patterns no member's walk reads team data from, by their start, each with why (and a check that it still holds).
UNWALKED = {
    "admin/": "the Django admin: staff only, every page of it sends bob to its login (checked below)",
    "accounts/invite/": "an invite's one-time link: only its signed token opens it, and a link bob forges for "
                        "alice is refused naming nobody (checked below)",
}

# Which object a path parameter names: by the path's segment before it and the parameter's name.
NAMED = {
    ("deployments", "name"): "deployment", ("models", "name"): "model", ("adapters", "adapter"): "adapter",
    ("adapters", "name"): "adapter", ("routes", "name"): "route", ("teams", "name"): "team",
    ("members", "user"): "user", ("tokens", "token_id"): "token", ("hosts", "name"): "host",
    ("agents", "host_name"): "host", ("agent-credentials", "host_name"): "host", ("replicas", "index"): "index",
    ("rules", "kind"): "rule",
}
# Objects every team has its own of; the rest (hosts, replica numbers, alert rules) every team shares.
OWNED = ("deployment", "model", "adapter", "route", "team", "user", "token")
SHARED = {"host": "h1", "index": "0", "rule": "slo_violation"}

# Query parameters that make a page or an operation show more, as templates over the same objects.
PAGE_QUERIES = {
    "dashboard": ["q=h1", "dq={deployment}"],
    "events": ["object=host/h1", "object=deployment/{deployment}", "object=replica/{deployment}%230",
               "object=route/{route}", "object=model/{model}", "object=adapter/{adapter}", "object=team/{team}",
               "reason=Ready"],
    "events-recent": ["object=host/h1", "object=deployment/{deployment}", "object=replica/{deployment}%230",
                      "object=model/{model}"],
    "audit": ["who={user}", "kind=deployment", "kind=route", "kind=token", "kind=model", "kind=team"],
    "usage": ["by=token", "by=deployment", "by=team", "model={deployment}"],
    "deployment-logs": ["replica=0"],
    "deployment": ["range=24h"],
    "host": ["range=24h"],
    "fleet-charts": ["range=24h"],
}
# An operation's query parameters that name an object (the rest are walked through their enums).
API_QUERIES = {"object": ["host/h1", "deployment/{deployment}", "replica/{deployment}%230", "route/{route}",
                          "model/{model}", "team/{team}"],
               "deployment": ["{deployment}"], "team": ["{team}"], "who": ["{user}"],
               "q": ["{deployment}", "{model}", "a"], "kind": ["deployment", "route", "token", "model", "team"],
               "resolved": ["true"]}
HTMX = {"HTTP_HX_REQUEST": "true"}
# What differs between two renders of one page: the CSRF token, ages ("just now", "5 s ago", "an hour ago") and
# figures (times, chart coordinates).
_VOLATILE = re.compile(r'(csrfmiddlewaretoken" value=|X-CSRFToken": |csrftoken=)"?[\w-]+|just now|\bnow\b'
                       r'|\b(\d+|an?) ?[a-z]+(, \d+ [a-z]+)? ago|\d+(\.\d+)?')


def patterns(resolver=None, prefix: str = "") -> list[tuple[str, str]]:
    """Every pattern of the URL conf as (route, name), the API's included, each route once."""
    found = []
    for p in (resolver or get_resolver()).url_patterns:
        route = prefix + str(p.pattern)
        if isinstance(p, URLResolver):
            found += patterns(p, route)
        elif isinstance(p, URLPattern):
            found.append((route, p.name or ""))
    return list({route: (route, name) for route, name in found}.values())


def template(route: str) -> str | None:
    """The route with each parameter as {kind} of the object it names; None when one names nothing known."""
    parts = []
    for i, segment in enumerate(route.split("/")):
        param = re.fullmatch(r"<(?:\w+:)?(\w+)>|\{(\w+)\}", segment)
        if param is None:
            parts.append(segment)
            continue
        kind = NAMED.get((route.split("/")[i - 1] if i else "", param.group(1) or param.group(2)))
        if kind is None:
            return None
        parts.append("{" + kind + "}")
    return "/" + "/".join(parts).lstrip("/")


def unwalked(route: str) -> bool:
    return any(route.startswith(prefix) for prefix in UNWALKED)


def test_every_url_pattern_is_walked():
    """A pattern the walk cannot fill fails here: teach NAMED its parameter, or list it in UNWALKED with why."""
    routes = [route for route, _ in patterns()]
    assert [r for r in routes if not unwalked(r) and template(r) is None] == []
    assert [prefix for prefix in UNWALKED if not any(r.startswith(prefix) for r in routes)] == []
    assert len(routes) > 60  # the console's pages and the API's operations, not a conf that failed to load


@dataclass(frozen=True)
class Sides:
    """Each kind of owned object's value for team b (own), team a (theirs) and nobody."""

    own: dict[str, str]
    theirs: dict[str, str]
    nobody: dict[str, str]


def _sides(scene: SharedScene) -> Sides:
    b = {"deployment": "chat-b", "model": "tiny-b", "adapter": "sql-b", "route": "route-b", "team": "team-b",
         "user": "bob", "token": str(scene.token_ids["bob"])}
    a = {"deployment": "chat-a", "model": "tiny-a", "adapter": "sql-a", "route": "route-a", "team": "team-a",
         "user": "alice", "token": str(scene.token_ids["alice"])}
    nobody = {"deployment": "chat-q", "model": "tiny-q", "adapter": "sql-q", "route": "route-q", "team": "team-q",
              "user": "quinn", "token": "987654"}
    return Sides(b | SHARED, a | SHARED, nobody | SHARED)


def _fill(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: quote(values[m.group(1)], safe=""), text)


def _body(response) -> str:
    raw = b"".join(response.streaming_content) if response.streaming else response.content
    headers = " ".join(f"{k}: {v}" for k, v in response.items())
    return headers + "\n" + raw.decode("utf-8", "replace")


def _requests() -> list[tuple[str, bool]]:
    """Every (URL template, htmx) the walk asks: each pattern plain and as htmx, with its page's queries; each GET
    operation of the API with each value of each enum parameter and each object-naming query."""
    asked = []
    for route, name in patterns():
        if unwalked(route):
            continue
        url = template(route)
        for query in ["", *(PAGE_QUERIES.get(name, []) if not route.startswith("api/") else [])]:
            for htmx in (False, True):
                asked.append((f"{url}?{query}" if query else url, htmx))
    schema = api.get_openapi_schema()
    for path, operations in schema["paths"].items():
        if "get" not in operations:
            continue
        url = template(path)
        assert url is not None, f"GET {path}: a parameter the walk cannot fill (NAMED)"
        params = [p for p in operations["get"].get("parameters", []) if p["in"] == "query"]
        variants = [[(p["name"], v) for v in API_QUERIES.get(p["name"], [])] + [
            (p["name"], v) for v in _enum(p, schema)] for p in params]
        required = [v for p, v in zip(params, variants, strict=True) if p.get("required")]
        optional = [v for p, v in zip(params, variants, strict=True) if not p.get("required")]
        for chosen in product(*required):  # every required parameter set, then each optional one alone
            base = dict(chosen)
            asked.append((f"{url}?{urlencode(base, safe='/{}%')}" if base else url, False))
            for name, value in (pair for options in optional for pair in options):
                asked.append((f"{url}?{urlencode(base | {name: value}, safe='/{}%')}", False))
    return list(dict.fromkeys(asked))


def _enum(param: dict, schema: dict) -> list:
    found = param.get("schema", {})
    if "$ref" in found:
        found = schema["components"]["schemas"][found["$ref"].rsplit("/", 1)[-1]]
    values = found.get("enum") or [v for option in found.get("anyOf", []) for v in option.get("enum", [])]
    return [str(v).lower() if isinstance(v, bool) else v for v in values]


@pytest.mark.django_db
def test_team_b_reads_no_name_of_team_as_on_any_page_fragment_chart_or_api_answer(client, tmp_path, monkeypatch):
    monkeypatch.setattr("console.fleet.logs.REPLY_TIMEOUT", 0.01)  # h1 has no agent: its logs answer 504 at once
    scene = shared_scene(tmp_path)
    sides = _sides(scene)
    assert client.login(username="bob", password=PASSWORD)
    leaks, unequal, failed, seen = [], [], [], []
    for url, htmx in _requests():
        extra = HTMX if htmx else {}
        mine = client.get(_fill(url, sides.own), **extra)
        body = _body(mine)
        seen.append(body)
        if mine.status_code == 500:
            failed.append(f"{_fill(url, sides.own)}: {mine.status_code}")
        leaks += [f"{_fill(url, sides.own)}{' (htmx)' if htmx else ''}: {s}" for s in scene.secrets if s in body]
        asked = [k for k in OWNED if "{" + k + "}" in url]
        if not asked:
            continue
        theirs = client.get(_fill(url, sides.theirs), **extra)
        nobody = client.get(_fill(url, sides.nobody), **extra)
        told, untold = _body(theirs), _body(nobody)
        for kind in asked:  # the names asked for are echoed ("no deployment named ..."): as the nobody's are
            told = told.replace(sides.theirs[kind], "NAME").replace(quote(sides.theirs[kind], safe=""), "NAME")
            untold = untold.replace(sides.nobody[kind], "NAME").replace(quote(sides.nobody[kind], safe=""), "NAME")
        leaks += [f"{_fill(url, sides.theirs)}{' (htmx)' if htmx else ''}: {s}" for s in scene.secrets if s in told]
        if theirs.status_code != nobody.status_code or _VOLATILE.sub("", told) != _VOLATILE.sub("", untold):
            unequal.append(f"{_fill(url, sides.theirs)}{' (htmx)' if htmx else ''}: {theirs.status_code} "
                           f"against {nobody.status_code} for a name nobody has")
    assert (failed, leaks, unequal) == ([], [], [])
    everything = "\n".join(seen)
    assert all(name in everything for name in ("chat-b", "tiny-b", "sql-b", "route-b", "team-b", "bob-ci-key"))


@pytest.mark.django_db
def test_the_admin_sends_a_member_to_its_login(client, tmp_path):
    shared_scene(tmp_path)
    assert client.login(username="bob", password=PASSWORD)
    for url in ("/admin/", "/admin/deployments/deployment/", "/admin/events/event/"):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], url


@pytest.mark.django_db
def test_an_invite_link_forged_for_another_teams_person_names_nobody(client, tmp_path):
    from django.contrib.auth import get_user_model
    from django.utils.encoding import force_bytes
    from django.utils.http import urlsafe_base64_encode

    shared_scene(tmp_path)
    assert client.login(username="bob", password=PASSWORD)
    alice = get_user_model().objects.get(username="alice")
    forged = f"/accounts/invite/{urlsafe_base64_encode(force_bytes(alice.pk))}/c2h-0123456789abcdef0123456789ab/"
    response = client.get(forged, follow=True)
    body = _body(response)
    assert response.status_code in (404, 410) and "alice" not in body and "team-a" not in body


def test_the_walk_asks_each_api_list_with_its_filters():
    asked = {url for url, _ in _requests()}
    assert "/api/v1/usage?group=token" in asked and "/api/v1/events?object=host/h1" in asked
    assert "/api/v1/alerts?resolved=true" in asked and "/api/v1/audit?kind=route" in asked
    assert "/api/v1/deployments/{deployment}/series?metric=request_rate" in asked
    assert json.dumps(sorted(UNWALKED))  # the exemptions stay few and explained


# The front door is no part of the URL conf (console/asgi.py sends /v1, /v2 and /metrics to it): its GET routes are
# walked from its own route table, each name filled as above, with bob's token.
GATEWAY_NAMED = {("models", "name"): "deployment", ("agents", "name"): "host", ("versions", "version"): "version"}
GATEWAY_SECRETS = ("chat-a", "sql-a", "tiny-a")


def gateway_requests() -> list[str]:
    """Each GET route of the gateway's app as a URL template ({deployment}, {host}, {version})."""
    from console.gateway.app import make_app

    found = []
    for route in make_app().routes:
        if "GET" not in (route.methods or ()):
            continue
        parts = route.path.split("/")
        for i, part in enumerate(parts):
            param = re.fullmatch(r"\{(\w+)(?::\w+)?\}", part)
            if param:
                kind = GATEWAY_NAMED.get((parts[i - 1], param.group(1)))
                assert kind is not None, f"GET {route.path}: a parameter the walk cannot fill (GATEWAY_NAMED)"
                parts[i] = "{" + kind + "}"
        found.append("/".join(parts))
    return found


@pytest.mark.django_db(transaction=True)
async def test_team_b_reads_no_name_of_team_as_at_the_front_door(tmp_path):
    from asgiref.sync import sync_to_async

    from console.fleet.models import AgentCredential
    from tests.console.gateway.test_gateway import FakeAgent, _client, _gateway
    from tests.console.team_scene import served_scene

    credential, _ = await sync_to_async(AgentCredential.issue)("h1")
    agent = FakeAgent(credential.gateway_secret, "h1")
    scene = await sync_to_async(served_scene)(tmp_path, await agent.start())
    values = {"own": {"deployment": "chat-b", "host": "h1", "version": "1"},
              "theirs": {"deployment": "chat-a", "host": "h1", "version": "1"},
              "nobody": {"deployment": "chat-q", "host": "h1", "version": "1"}}
    gateway, leaks, unequal, seen = _gateway(), [], [], ""
    try:
        async with _client(gateway, scene.tokens["bob"]) as bob:
            for url in gateway_requests():
                mine = await bob.get(_fill(url, values["own"]))
                seen += mine.text
                leaks += [f"{url}: {s}" for s in GATEWAY_SECRETS if s in mine.text]
                if "{deployment}" in url:
                    theirs = await bob.get(_fill(url, values["theirs"]))
                    nobody = await bob.get(_fill(url, values["nobody"]))
                    told = theirs.text.replace("chat-a", "NAME")
                    leaks += [f"{_fill(url, values['theirs'])}: {s}" for s in GATEWAY_SECRETS if s in told]
                    if (theirs.status_code, told) != (nobody.status_code, nobody.text.replace("chat-q", "NAME")):
                        unequal.append(f"{_fill(url, values['theirs'])}: {theirs.status_code} against "
                                       f"{nobody.status_code}")
    finally:
        await gateway.close()
        await agent.runner.cleanup()
    assert (leaks, unequal) == ([], [])
    assert "chat-b" in seen and "sql-b" in seen  # its own are listed
    assert len(gateway_requests()) >= 10  # /v1/models, the v2 model routes, health and /metrics, at least
