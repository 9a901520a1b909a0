"""The dashboard: GPU segments by replica state, host labels and sleep room, the deployments table, and
the note on what decides placement."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from console.accounts.scope import TeamScope
from console.deployments.models import Deployment
from console.fleet.presenters import gpu_short_name
from console.fleet.views import grid_context
from tests.console.fleet_scene import scene

pytestmark = pytest.mark.django_db


@pytest.fixture
def html(user_client, model_dir):
    scene(str(model_dir))
    return user_client.get("/").content.decode()


def element(html: str, start: str, end: str) -> str:
    i = html.index(start)
    return re.sub(r"\s+", " ", html[i:html.index(end, i) + len(end)])


def test_segments_are_coloured_by_state_and_a_loading_one_shows_its_progress(html):
    seg = re.search(r'<div class="seg state-loading"[^>]*data-replica="chat#2".*?</span>', html, re.S).group(0)
    assert '<div class="load" style="width: 42%"></div>' in seg
    assert 'class="seg state-preloaded"' in html and 'class="seg state-sleeping"' in html
    assert '<span class="pill state-loading">loading 42%</span>' in html


def test_a_segment_too_narrow_for_its_name_leaves_it_to_the_tooltip_and_legend(html):
    wide = re.search(r'data-replica="chat#0".*?</div>\s*(.*?)\s*</div>', html, re.S).group(1)
    narrow = re.search(r'data-replica="summarize#0".*?</div>\s*(.*?)\s*</div>', html, re.S).group(1)
    assert wide == "<span>chat</span>" and narrow == ""
    assert 'summarize#0</a>' in html


def test_a_segment_tooltip_has_the_mps_share_and_the_schedulers_reason(html):
    seg = re.search(r'data-replica="chat#0" data-action="keep" title="([^"]*)"', html).group(1)
    assert seg.startswith("chat#0 · ready · reserved 20.00 GiB · measured 18.40 GiB · MPS 72% of SMs")
    assert "keep: kept on gpu-a/0: it still fits" in seg
    waking = re.search(r'data-replica="summarize#0" data-action="wake" title="([^"]*)"', html).group(1)
    assert waking.startswith("summarize#0 · sleeping → ready")


def test_each_host_lists_its_labels_its_sleep_room_and_what_sleeps_there(html):
    host_a = element(html, '<article class="host card" data-host="gpu-a">', "</article>")
    assert '<h2><a href="/hosts/gpu-a/">gpu-a</a></h2>' in host_a
    assert ">zone=eu-1</span>" in host_a and ">gpu=h100</span>" in host_a
    assert "Host RAM for sleeping replicas:</span> <strong>41.00 GiB</strong> free" in host_a
    assert 'data-asleep="nightly-batch#0">nightly-batch#0 8.00 GiB</a>' in host_a
    host_b = element(html, '<article class="host card" data-host="gpu-b">', "</article>")
    assert ">gpu=a100</span>" in host_b and "summarize#0 86.7 MiB (waking)" in host_b


def test_each_gpu_shows_what_tells_it_apart_and_its_full_name_in_the_tooltip(html):
    host_a = element(html, '<article class="host card" data-host="gpu-a">', "</article>")
    assert '<span class="gpu-name" title="NVIDIA H100 80GB HBM3">H100 80GB HBM3</span>' in host_a
    host_b = element(html, '<article class="host card" data-host="gpu-b">', "</article>")
    assert '<span class="gpu-name" title="NVIDIA A100-SXM4-40GB">A100-SXM4-40GB</span>' in host_b


@pytest.mark.parametrize(("name", "shown"), [
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("Simulated GPU 24 GiB", "24 GiB"),  # its pill says simulated
    ("Tesla V100-SXM2-16GB", "V100-SXM2-16GB"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000 Blackwell…"),  # cut after a whole word
    ("NVIDIA", "NVIDIA"),
])
def test_a_gpus_short_name_drops_the_makers_words_and_stays_short(name, shown):
    assert gpu_short_name(name) == shown


def test_a_host_without_sleepers_or_sleep_figures_says_so(user_client, host):
    page = user_client.get("/").content.decode()
    assert "not reported" in page and "nothing asleep" in page and "gpu=sim" in page


def test_the_deployments_table_shows_priority_replica_range_and_slo(html):
    chat = element(html, '<tr data-deployment="chat">', "</tr>")
    assert 'class="tag prio-critical">critical' in chat and "latency-critical" in chat
    assert '3 <span class="muted">of 1–4</span>' in chat and "2 ready · 1 loading" in chat
    assert 'data-slo="violating">violating' in chat and "340 ms / 200 ms" in chat and "48.2 req/s" in chat
    assert chat.count('class="pill') == 1  # the state is the row's only pill (tests and scripts look for it)
    embed = element(html, '<tr data-deployment="embed">', "</tr>")
    assert '2 <span class="muted">fixed</span>' in embed and 'data-slo="ok">within SLO' in embed
    big = element(html, '<tr data-deployment="big">', "</tr>")
    assert 'data-slo="none">no SLO' in big and "needs 92.00 GiB" in big and "unschedulable" in big


def test_the_scheduler_note_names_the_strategy_in_use(user_client, settings):
    settings.MODELGRID_STRATEGY = "latency-sensitive"
    page = user_client.get("/").content.decode()
    note = element(page, '<details class="scheduler-note"', "</details>")
    assert "<strong data-strategy>latency-sensitive</strong>" in note and "GPU of their own" in note
    assert "docs/placement.md" in note and 'href="/api/v1/docs"' in note


def test_the_websocket_render_has_the_same_grid(model_dir):
    from django.template.loader import render_to_string

    scene(str(model_dir))
    live = render_to_string("fleet/_live.html", grid_context(None, TeamScope()))
    assert 'id="fleet-grid"' in live and 'id="deployment-table"' in live and "nightly-batch#0 8.00 GiB" in live


def test_each_deployment_row_says_what_its_next_request_meets(html):
    words = {"chat": "ready", "embed": "ready", "summarize": "waking", "nightly-batch": "asleep", "big": "cold"}
    for name, word in words.items():
        row = element(html, f'<tr data-deployment="{name}">', "</tr>")
        assert f'<span class="serving serving-{word}" data-serving="{word}"' in row, name
    nightly = element(html, '<tr data-deployment="nightly-batch">', "</tr>")
    assert "to zero after 5 min idle" in nightly  # min replicas 0
    assert "to zero after" not in element(html, '<tr data-deployment="chat">', "</tr>")


def test_a_row_counts_the_requests_waiting_for_a_replica(user_client, model_dir):
    scene(str(model_dir))
    Deployment.objects.filter(name="nightly-batch").update(
        demand=3, demand_at=timezone.now(), demand_status="served", demand_reason="woke nightly-batch#0 on gpu-a/1")
    page = user_client.get("/").content.decode()
    nightly = element(page, '<tr data-deployment="nightly-batch">', "</tr>")
    assert 'data-demand="served" title="woke nightly-batch#0 on gpu-a/1">3 waiting</div>' in nightly
    Deployment.objects.filter(name="nightly-batch").update(demand_at=timezone.now() - timedelta(minutes=1))
    page = user_client.get("/").content.decode()
    assert "3 waiting" not in element(page, '<tr data-deployment="nightly-batch">', "</tr>")


# -- at fleet scale: the summary, search, state filters and pages -------------------------------------------


def summary_card(html: str, name: str) -> str:
    """One card of the summary strip: up to the next card or the strip's end."""
    start = html.index(f'<div class="stat" data-summary="{name}">')
    ends = [i for i in (html.find('<div class="stat" data-summary=', start + 1), html.find("</section>", start))
            if i > 0]
    return re.sub(r"\s+", " ", html[start:min(ends)])


def test_the_summary_counts_the_whole_fleet(html):
    hosts = summary_card(html, "hosts")
    assert '<span class="stat-value">2</span>' in hosts
    assert 'data-host-state="connected" title="show only connected hosts"><i></i><b>2</b> connected' in hosts
    assert "<b>0</b> unknown" in hosts and "<b>0</b> offline" in hosts
    assert '<span class="stat-value">3</span>' in summary_card(html, "gpus")
    memory = summary_card(html, "memory")  # 20 + 6 on a0, 20 + 6 on a1, 20 + 2 on b0 of 200 GiB
    assert "74.00 GiB <span class=\"target\">of 200.00 GiB</span>" in memory and "37.0% reserved" in memory
    replicas = summary_card(html, "replicas")
    assert '<span class="stat-value">8</span>' in replicas
    assert re.findall(r'data-replica-state="(\w+)"><i></i><b>(\d+)</b>', replicas) == [
        ("ready", "3"), ("preloaded", "1"), ("loading", "1"), ("pending", "1"), ("sleeping", "2")]
    deployments = summary_card(html, "deployments")
    assert "1 violating SLO" in deployments
    assert re.findall(r'data-deployment-state="(\w+)"[^>]*><i></i><b>(\d+)</b>', deployments) == [
        ("ready", "2"), ("loading", "1"), ("pending", "1"), ("unschedulable", "1")]


def many_hosts(n: int, prefix: str = "node", **fields) -> None:
    from console.fleet.models import Gpu, Host

    hosts = Host.objects.bulk_create(Host(name=f"{prefix}-{i:03d}", **fields) for i in range(n))
    Gpu.objects.bulk_create(Gpu(host=h, index=0, uuid=f"{h.name}-0", name="sim", total_bytes=1 << 34) for h in hosts)


def host_names(html: str) -> list[str]:
    return re.findall(r'<article class="host card" data-host="([^"]+)">', html)


def test_hosts_come_25_to_a_page_with_links_that_keep_the_query(user_client):
    many_hosts(60)
    first = user_client.get("/").content.decode()
    assert host_names(first) == [f"node-{i:03d}" for i in range(25)]
    assert "<strong>1–25</strong> of 60 hosts" in first
    page3 = user_client.get("/?page=3&dq=chat").content.decode()
    assert host_names(page3) == [f"node-{i:03d}" for i in range(50, 60)]
    assert 'href="?page=2&amp;dq=chat#hosts" rel="prev"' in page3 and 'rel="next"' not in page3


def test_the_host_search_and_state_filter_narrow_the_hosts(user_client):
    many_hosts(3, prefix="edge", connected=True)
    many_hosts(2, prefix="core", connected=True)
    many_hosts(2, prefix="lost", connected=False, unknown_since=timezone.now())
    assert host_names(user_client.get("/?q=CORE").content.decode()) == ["core-000", "core-001"]
    assert host_names(user_client.get("/?state=unknown").content.decode()) == ["lost-000", "lost-001"]
    page = user_client.get("/?q=edge&state=unknown").content.decode()
    assert host_names(page) == [] and "No host matches" in page and "Show every host" in page
    assert 'value="edge"' in page and '<option value="unknown" selected>' in page


def test_deployments_are_searched_filtered_and_paged_apart_from_the_hosts(user_client, model_dir, monkeypatch):
    from console.fleet import views

    scene(str(model_dir))
    page = user_client.get("/?dq=B&dstate=ready").content.decode()
    assert re.findall(r'<tr data-deployment="([^"]+)">', page) == ["embed", "nightly-batch"]
    assert host_names(page) == ["gpu-a", "gpu-b"]
    assert '<input type="hidden" name="dq" value="B">' in page  # the host search keeps the deployments' filter
    monkeypatch.setattr(views, "DEPLOYMENTS_PER_PAGE", 2)
    second = user_client.get("/?dpage=2").content.decode()
    assert re.findall(r'<tr data-deployment="([^"]+)">', second) == ["embed", "nightly-batch"]
    assert "<strong>3–4</strong> of 5 deployments" in second


def test_a_page_that_cannot_be_shown_says_what_it_shows_instead(user_client):
    many_hosts(3)
    page = user_client.get("/?page=9&state=gone&dpage=x").content.decode()
    assert host_names(page) == ["node-000", "node-001", "node-002"]
    notes = element(page, '<ul class="notes" data-notes>', "</ul>")
    assert "state “gone” is not a host state (connected, unknown, offline); showing every host" in notes
    assert "dpage “x” is not a page number; showing page 1" in notes
    assert "page 9 is past the last page (1); showing page 1" in notes


def test_the_live_websocket_url_carries_the_pages_query(user_client):
    page = user_client.get("/?q=node&page=2").content.decode()
    assert 'ws-connect="/ws/dashboard/?q=node&amp;page=2"' in page
    assert 'ws-connect="/ws/dashboard/"' in user_client.get("/").content.decode()


def test_the_dashboards_queries_do_not_grow_with_the_fleet(user_client, model_dir):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    scene(str(model_dir))
    with CaptureQueriesContext(connection) as small:
        user_client.get("/")
    many_hosts(40)
    with CaptureQueriesContext(connection) as large:
        user_client.get("/")
    assert len(large.captured_queries) == len(small.captured_queries) <= 25


def test_a_draining_worker_of_our_own_is_never_shown_as_other_processes(user_client, host):
    # The agent says its own workers hold 10 GiB on this GPU (a replica moved away and still draining here);
    # no replica row points at the GPU any more, so only own_bytes can tell that memory is ModelGrid's.
    from console.fleet.models import Gpu
    Gpu.objects.filter(host=host).update(used_bytes=12 << 30, own_bytes=10 << 30)
    page = user_client.get("/").content.decode()
    assert "used by processes ModelGrid does not own: 2.00 GiB" in page
    assert "other processes <span class=\"muted\">2.00 GiB</span>" in page
