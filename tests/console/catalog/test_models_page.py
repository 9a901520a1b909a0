"""The Models page as a member of one team sees it: their teams' models and deployments, and "Recent loads" of their
deployments only; the corrections per architecture family, which name nothing, are every team's."""

import re

import pytest

from tests.console.team_scene import PASSWORD, shared_scene

pytestmark = pytest.mark.django_db


def test_recent_loads_name_the_readers_teams_deployments_only(client, tmp_path):
    shared_scene(tmp_path)
    loads = {}
    for user in ("bob", "root"):
        client.login(username=user, password=PASSWORD)
        page = client.get("/models/").content.decode()
        assert 'data-calibration="llama/cpu"' in page
        recent = page[page.index("Recent loads"):]
        loads[user] = sorted(re.findall(r"<tr><td>([\w-]+) <span", recent))
    assert loads == {"bob": ["chat-b"], "root": ["chat-a", "chat-b"]}
