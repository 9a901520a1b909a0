"""The charts on the deployment page and the dashboard, and the fragments htmx polls."""

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from console.deployments.models import Deployment
from console.deployments.services import create_deployment
from console.series.sampler import sample
from tests.console.team_scene import PASSWORD, team_scene

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def chat(host, model):
    return create_deployment("chat", "tiny", slo_latency_ms=200)


def record_traffic(rates=(0.0, 4.0, 6.0)):
    """A tick per rate, 10 s apart, ending now; latency 50 ms while there is traffic."""
    start = timezone.now() - timedelta(seconds=10 * (len(rates) - 1))
    for i, rps in enumerate(rates):
        Deployment.objects.filter(name="chat").update(traffic_rps=rps, observed_p95_ms=50.0 if rps else None)
        sample(start + timedelta(seconds=10 * i))


def charts(html: str) -> dict[str, str]:
    """Each chart's opening tag by its data-chart name."""
    return {m.group(1): m.group(0) for m in re.finditer(r'<figure class="chart" data-chart="([a-z_]+)"[^>]*>', html)}


def attr(tag: str, name: str) -> str:
    return re.search(rf'{name}="([^"]*)"', tag).group(1)


def test_the_fragments_need_a_login(chat):
    for url in ("/deployments/chat/charts/", "/fleet/charts/"):
        assert Client().get(url).status_code == 302
        r = Client().get(url, HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL="http://testserver/deployments/chat/")
        assert r.status_code == 200 and r["HX-Redirect"].startswith("/accounts/login/?next=")


def test_the_deployment_page_draws_its_five_charts_with_the_slo_line(user_client, chat):
    record_traffic()
    html = user_client.get("/deployments/chat/").content.decode()
    found = charts(html)
    assert set(found) == {"request_rate", "latency", "queue_ms", "errors", "replicas"}
    assert int(attr(found["request_rate"], "data-points")) == 3 and attr(found["request_rate"], "data-max") == "6.0"
    assert attr(found["latency"], "data-target") == "200"
    assert "SLO p95 200 ms" in html and 'class="target"' in html
    assert re.search(r'<path class="line s-rate" d="M[\d. L]+"', html)
    assert "No data yet" in html  # the queue: no gateway reported a wait


def test_a_deployment_without_an_slo_has_no_target_line(user_client, chat):
    Deployment.objects.filter(name="chat").update(slo_latency_ms=None)
    record_traffic()
    html = user_client.get("/deployments/chat/").content.decode()
    assert "data-target" not in charts(html)["latency"] and "SLO p95" not in html


def test_before_any_sample_every_chart_says_no_data_yet(user_client, chat):
    html = user_client.get("/deployments/chat/").content.decode()
    assert {attr(tag, "data-points") for tag in charts(html).values()} == {"0"}
    assert html.count("No data yet") == 5 and "<svg class=\"chart-svg\"" not in html


def test_the_fragment_polls_every_10_s_in_the_range_chosen(user_client, chat):
    record_traffic()
    r = user_client.get("/deployments/chat/charts/?range=6h", **HTMX)
    html = r.content.decode()
    assert r.status_code == 200 and "HX-Request" in r["Vary"]
    assert 'hx-get="/deployments/chat/charts/?range=6h" hx-trigger="every 10s"' in html
    assert re.search(r'<a [^>]*data-range="6h" class="current"', html)
    assert len(charts(html)) == 5


def test_an_unknown_range_is_the_default_hour(user_client, chat):
    html = user_client.get("/deployments/chat/charts/?range=1y", **HTMX).content.decode()
    assert 'data-range="1h"' in html


def test_the_page_opens_in_the_range_of_its_link(user_client, chat):
    html = user_client.get("/deployments/chat/?range=7d").content.decode()
    assert re.search(r'<a [^>]*data-range="7d" class="current"', html) and "5-minute means" in html


def test_without_htmx_the_fragment_sends_the_browser_to_the_page(user_client, chat):
    r = user_client.get("/deployments/chat/charts/?range=24h")
    assert r.status_code == 302 and r["Location"] == "/deployments/chat/?range=24h#charts"


def test_a_deleted_deployment_stops_the_polling(user_client, chat):
    Deployment.objects.filter(name="chat").delete()
    r = user_client.get("/deployments/chat/charts/", **HTMX)
    assert r.status_code == 286 and "was deleted" in r.content.decode()
    assert user_client.get("/deployments/chat/charts/").status_code == 404


def test_the_dashboard_draws_fleet_memory_against_its_total_and_request_rate(user_client, chat):
    record_traffic()
    html = user_client.get("/").content.decode()
    found = charts(html)
    assert set(found) == {"fleet_memory", "fleet_request_rate"}
    assert attr(found["fleet_request_rate"], "data-last") == "6.0"
    assert 'class="line s-total dashed"' in html and "other processes" in html
    fragment = user_client.get("/fleet/charts/?range=24h", **HTMX).content.decode()
    assert 'hx-get="/fleet/charts/?range=24h"' in fragment


def test_hover_titles_name_the_time_and_values(user_client, chat):
    record_traffic()
    html = user_client.get("/deployments/chat/charts/", **HTMX).content.decode()
    assert re.search(r"<title>\d\d:\d\d–\d\d:\d\d UTC · requests [1-9][\d.]* req/s</title>", html)
    assert re.search(r"<title>\d\d:\d\d–\d\d:\d\d UTC · p50 – · p95 50 ms</title>", html)


def test_the_charts_cost_the_same_few_queries_however_much_was_recorded(user_client, chat):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    start = timezone.now() - timedelta(minutes=20)
    for i in range(2):
        sample(start + timedelta(seconds=10 * i))
    with CaptureQueriesContext(connection) as few:
        user_client.get("/deployments/chat/charts/", **HTMX)
    for i in range(2, 90):  # a changing rate for 15 minutes
        Deployment.objects.filter(name="chat").update(traffic_rps=float(i), observed_p95_ms=float(i))
        sample(start + timedelta(seconds=10 * i))
    with CaptureQueriesContext(connection) as many:
        user_client.get("/deployments/chat/charts/", **HTMX)
    assert len(many.captured_queries) == len(few.captured_queries) <= 12


def test_the_host_page_draws_its_memory_and_utilisation(user_client, chat, host):
    from console.fleet.models import Gpu

    Gpu.objects.filter(host=host).update(used_bytes=3 << 30, own_bytes=1 << 30, utilization=40.0)
    record_traffic()
    html = user_client.get(f"/hosts/{host.name}/charts/", **HTMX).content.decode()
    found = charts(html)
    assert set(found) == {"host_memory", "utilization"}
    assert attr(found["utilization"], "data-last") == "40.0"
    assert attr(found["host_memory"], "data-points") != "0" and "other processes" in html
    assert 'hx-get="/hosts/h1/charts/?range=1h" hx-trigger="every 10s"' in html
    page = user_client.get(f"/hosts/{host.name}/").content.decode()
    assert set(charts(page)) == {"host_memory", "utilization"}


def test_a_host_that_is_gone_stops_the_polling(user_client, host):
    host.delete()
    r = user_client.get("/hosts/h1/charts/", **HTMX)
    assert r.status_code == 286 and "Host h1 is gone" in r.content.decode()


def test_the_dashboards_request_rate_counts_the_readers_teams_deployments_only(client, tmp_path):
    team_scene(tmp_path)
    Deployment.objects.filter(name="chat-a").update(traffic_rps=5.0)
    Deployment.objects.filter(name="chat-b").update(traffic_rps=2.0)
    sample(timezone.now())
    seen = {}
    for user in ("alice", "bob", "root"):
        client.login(username=user, password=PASSWORD)
        page = charts(client.get("/").content.decode())["fleet_request_rate"]
        fragment = client.get("/fleet/charts/", **HTMX).content.decode()
        assert charts(fragment)["fleet_request_rate"] == page
        seen[user] = attr(page, "data-max")
    assert seen == {"alice": "5.0", "bob": "2.0", "root": "7.0"}
