"""The deployment page shows the routes that send it traffic: as a branch (with its share) or as their fallback."""

import re

import pytest

from console.deployments.services import create_deployment
from console.routes.services import create_route

pytestmark = pytest.mark.django_db


def test_the_deployment_page_shows_the_routes_that_send_it_traffic(user_client, model):
    for name in ("chat", "chat-v2", "spare"):
        create_deployment(name, "tiny")
    create_route("assistant", [{"deployment": "chat", "weight": 95}, {"deployment": "chat-v2", "weight": 5}],
                 fallback="spare")
    create_route("other", [{"deployment": "chat"}])

    def section(name: str) -> str:
        html = user_client.get(f"/deployments/{name}/").content.decode()
        match = re.search(r'<section class="card" id="routes">.*?</section>', html, re.S)
        assert match, f"no routes section on {name}'s page"
        return re.sub(r"\s+", " ", match.group(0))

    canary = section("chat-v2")
    assert "assistant" in canary and "5%" in canary and "other" not in canary
    assert re.search(r'data-route="assistant".*?95% chat.*?5% chat-v2.*?fallback spare', canary)
    assert "100%" in section("chat")  # route other sends it all of its traffic
    spare = section("spare")
    assert "assistant" in spare and "fallback" in spare


def test_a_deployment_no_route_names_says_how_to_make_one(user_client, model):
    create_deployment("chat", "tiny")
    html = user_client.get("/deployments/chat/").content.decode()
    assert "No route sends it traffic" in html and "/api/v1/routes" in html
