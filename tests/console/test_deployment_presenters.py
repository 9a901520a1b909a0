"""What the deployment presenters add for the pages reaches the API too (GET /api/v1/deployments/{name})."""

import pytest

from console.deployments.models import Deployment
from console.deployments.presenters import for_people, heading_for, load_progress, scale_status
from tests.console.fleet_scene import scene

pytestmark = pytest.mark.django_db


def test_the_api_reports_progress_sleep_figures_adapter_use_and_scale_times(api, model_dir):
    scene(str(model_dir))
    body = api.get("/api/v1/deployments/chat").json()
    assert body["status_since"] and body["last_scale_at"]
    loading = body["replicas"][2]
    assert (loading["loaded_bytes"], loading["loading_total_bytes"]) == (int(7.5 * 2**30), int(17.8 * 2**30))
    assert body["replicas"][0]["adapter_stats"][0] == {"name": "sql", "tier": "gpu", "pinned": True,
                                                       "nbytes": 12 * 2**20, "requests": 1200, "hits": 80,
                                                       "misses": 3}
    sql = next(a for a in body["adapters"] if a["name"] == "sql")
    assert sql["tiers"] == [{"replica": 0, "tier": "gpu"}, {"replica": 1, "tier": "gpu"}]
    assert (sql["requests"], sql["hits"], sql["misses"]) == (2100, 140, 5)
    asleep = api.get("/api/v1/deployments/nightly-batch").json()["replicas"][0]
    assert asleep["host_bytes"] == 8 * 2**30 and asleep["sleep_wake"]["direction"] == "sleep"
    assert asleep["adapter_error"] == "" and asleep["adapter_stats"] == []


def test_a_replica_shows_its_target_only_when_it_is_not_on_its_way_there():
    assert heading_for("loading", "ready") is None and heading_for("ready", "ready") is None
    assert heading_for("sleeping", "ready") == "ready" and heading_for("ready", "sleeping") == "sleeping"
    assert heading_for("loading", "preloaded") == "preloaded" and heading_for("failed", "ready") == "ready"


def test_load_progress_is_a_percentage_while_loading_only():
    assert load_progress("loading", 42, 100) == 42 and load_progress("loading", None, 100) == 0
    assert load_progress("loading", 5, None) is None and load_progress("ready", 100, 100) is None


def test_the_scale_direction_comes_from_the_rows_the_last_change_made(model_dir):
    scene(str(model_dir))
    chat = Deployment.objects.get(name="chat")
    rows = list(chat.replica_set.all())
    assert scale_status(chat, rows)["direction"] == "up"
    assert scale_status(chat, [r for r in rows if r.index < 2])["direction"] == "down"
    chat.last_scale_at = None
    assert scale_status(chat, rows)["direction"] is None


@pytest.mark.parametrize("seconds, text", [(45, "45 s"), (60, "1 min"), (300, "5 min"), (90, "90 s"),
                                           (5400, "90 min"), (7200, "2 h"), (86400, "1 day"), (604800, "7 days")])
def test_an_idle_timeout_reads_in_the_largest_unit_that_divides_it(seconds, text):
    assert for_people(seconds) == text
