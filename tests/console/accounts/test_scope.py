"""The team scope (console/accounts/scope.py): what a member of one team reads of each kind of row, what an admin
reads, and the timeline's events, each stamped with its object's team when recorded, so that a deleted object's
history stays its team's and a name another team takes again does not hand that history over."""

import pytest
from django.contrib.auth import get_user_model

from console.accounts.models import ApiToken
from console.accounts.scope import OTHER_TEAM, TeamScope
from console.catalog.models import MemorySample, Model
from console.deployments.services import create_deployment, delete_deployment
from console.events.models import Event
from console.events.record import Note, record
from console.fleet.services import set_strategy
from tests.console.team_scene import team_scene

pytestmark = pytest.mark.django_db


@pytest.fixture
def scene(tmp_path):
    return team_scene(tmp_path)


def scope_of(username: str) -> TeamScope:
    return TeamScope.of(get_user_model().objects.get(username=username))


def objects(scope: TeamScope) -> set[str]:
    return set(scope.events(Event.objects.all()).values_list("object", flat=True))


def test_a_member_acts_within_their_teams_and_an_admin_within_all(scene):
    assert scope_of("alice").teams == frozenset({scene.a.pk}) and not scope_of("alice").everything
    assert scope_of("root").everything and scope_of("root").owns(scene.b.pk)
    assert set(scope_of("bob").deployments().values_list("name", flat=True)) == {"chat-b"}
    assert set(scope_of("bob").models().values_list("name", flat=True)) == {"tiny-b"}
    assert set(scope_of("root").deployments().values_list("name", flat=True)) == {"chat-a", "chat-b"}


def test_membership_is_read_when_a_scope_is_made(scene):
    bob = get_user_model().objects.get(username="bob")
    before = TeamScope.of(bob)
    scene.b.members.remove(bob)
    assert before.owns(scene.b.pk) and not TeamScope.of(bob).owns(scene.b.pk)
    assert not TeamScope.of(bob).deployments().exists()


def test_a_member_reads_their_teams_events_and_the_fleets_but_no_other_teams(scene):
    record([Note("replica/chat-a#0", "Ready", "loaded", deployment="chat-a", host="h1"),
            Note("replica/chat-b#0", "Ready", "loaded", deployment="chat-b", host="h1"),
            Note("host/h1", "Connected", "agent connected", host="h1")])
    set_strategy(get_user_model().objects.get(username="root"), "balance", actor="user root")
    bob = objects(scope_of("bob"))
    assert {"replica/chat-b#0", "deployment/chat-b", "model/tiny-b", "adapter/sql-b", "host/h1",
            "scheduler"} <= bob
    assert not {o for o in bob if o.endswith("-a") or "-a#" in o or "/alice/" in o}
    assert {"replica/chat-a#0", "replica/chat-b#0", "token/alice/bot"} <= objects(scope_of("root"))


def test_a_members_fellows_tokens_are_told_and_strangers_are_not(scene):
    carol = get_user_model().objects.create_user("carol", password="unused-password-123")
    carol.teams.set([scene.b])
    ApiToken.issue(carol, "carols-key")
    seen = objects(scope_of("bob"))
    assert "token/carol/carols-key" in seen and "token/bob/bot" in seen and "token/alice/bot" not in seen


def test_a_deleted_deployments_events_stay_its_teams(scene):
    create_deployment("old-a", "tiny-a", actor="user alice")
    delete_deployment("old-a", actor="user alice")
    assert {"Created", "Deleted"} <= set(Event.objects.filter(object="deployment/old-a").values_list("reason",
                                                                                                        flat=True))
    assert "deployment/old-a" in objects(scope_of("alice"))
    assert "deployment/old-a" not in objects(scope_of("bob"))


def test_a_name_another_team_takes_again_does_not_hand_over_its_history(scene):
    create_deployment("shared-name", "tiny-a", actor="user alice")
    delete_deployment("shared-name", actor="user alice")
    create_deployment("shared-name", "tiny-b", actor="user bob")
    bobs = scope_of("bob").events(Event.objects.filter(deployment="shared-name"))
    assert list(bobs.values_list("reason", "actor")) == [("Created", "user bob")]
    assert set(scope_of("alice").events(Event.objects.filter(deployment="shared-name")).values_list(
        "actor", flat=True)) == {"user alice"}


def test_an_event_of_an_object_no_team_owns_any_longer_is_for_admins_only(scene):
    record([Note("replica/vanished#0", "Ready", "loaded", deployment="vanished", host="h1")])
    assert Event.objects.get(object="replica/vanished#0").team is None
    assert "replica/vanished#0" not in objects(scope_of("alice"))
    assert "replica/vanished#0" in objects(scope_of("root"))


def test_a_replica_on_a_shared_gpu_is_unnamed_to_other_teams_and_keeps_its_memory(scene):
    row = {"deployment": "chat-a", "team": scene.a.pk, "index": 0, "reason": "placed chat-a#0 on h1/0",
           "action": "place", "observed_reason": "", "reserved_bytes": 1 << 30}
    assert scope_of("alice").replica(row) == row and scope_of("root").replica(row) == row
    seen = scope_of("bob").replica(row)
    assert seen["deployment"] == OTHER_TEAM and seen["reason"] == seen["action"] == ""
    assert seen["reserved_bytes"] == 1 << 30


def test_a_measured_load_is_its_deployments_teams(scene):
    for side, deployment in (("a", "chat-a"), ("b", "chat-b"), ("a", "gone-a")):
        MemorySample.objects.create(load_key=f"h1/{deployment}", model=Model.objects.get(name=f"tiny-{side}"),
                                    deployment=deployment, family="llama", architecture="LlamaForCausalLM",
                                    device="cpu", dtype="float32", batch=1, seq=8, estimated_bytes=1,
                                    calibrated_bytes=1, measured_bytes=1)
    assert list(scope_of("bob").samples().values_list("deployment", flat=True)) == ["chat-b"]
    assert list(scope_of("alice").samples().values_list("deployment", flat=True)) == ["chat-a"]  # gone: admins'
    assert scope_of("root").samples().count() == 3


def test_a_member_sees_the_request_rate_of_their_teams_and_an_admin_the_fleets(scene):
    assert scope_of("bob").request_rate_series() == [("team", scene.b.pk)]
    assert scope_of("root").request_rate_series() == [("fleet", 0)]


def test_a_fellows_token_names_no_deployment_of_a_team_the_reader_is_not_in(scene):
    alice = get_user_model().objects.get(username="alice")
    scene.b.members.add(alice)  # in both teams: bob's fellow, whose tokens bob reads of
    ApiToken.issue(alice, "a-only", deployments=["chat-a"], actor="user alice")
    told = " ".join(scope_of("bob").events(Event.objects.all()).values_list("message", flat=True))
    assert "token/alice/a-only" in objects(scope_of("bob"))
    assert "chat-a" not in told, told
