"""The migration that stamps the events recorded before events carried their team: each gets its object's team as
it is then (a deployment's and its replicas' the deployment's, a model's, adapter's, route's and team's their own);
hosts' stay no team's, and so does an object already gone (admins only)."""

import importlib

import pytest
from django.apps import apps
from django.utils import timezone

from console.events.models import Event
from tests.console.team_scene import team_scene

pytestmark = pytest.mark.django_db
stamp = importlib.import_module("console.events.migrations.0002_event_team").stamp


def test_events_recorded_before_are_stamped_with_their_objects_teams(tmp_path):
    scene = team_scene(tmp_path)
    now = timezone.now()
    for obj, deployment in (("replica/chat-a#0", "chat-a"), ("deployment/chat-b", "chat-b"), ("model/tiny-a", ""),
                            ("adapter/sql-b", "chat-b"), ("team/team-a", ""), ("host/h1", ""),
                            ("replica/gone#0", "gone"), ("token/alice/bot", "")):
        Event.objects.create(object=obj, deployment=deployment, reason="Old", message="before teams",
                             first_seen=now, last_seen=now)
    stamp(apps, None)
    stamped = dict(Event.objects.filter(reason="Old").values_list("object", "team"))
    a, b = scene.a.pk, scene.b.pk
    assert stamped == {"replica/chat-a#0": a, "deployment/chat-b": b, "model/tiny-a": a, "adapter/sql-b": b,
                       "team/team-a": a, "host/h1": None, "replica/gone#0": None, "token/alice/bot": None}
