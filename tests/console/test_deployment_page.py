"""The deployment page: live status fragment, replica table, adapters, and the Policy and SLO form
(htmx and without JavaScript)."""

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from console.deployments.models import Deployment
from tests.console.fleet_scene import scene

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def fleet(model_dir):
    return scene(str(model_dir))


def policy_form(dep: Deployment, **changes) -> dict:
    """The form as the page fills it for `dep`, with `changes` typed over it."""
    form = {"priority": dep.priority, "min_replicas": dep.min_replicas, "max_replicas": dep.max_replicas,
            "gpus_per_replica": dep.gpus_per_replica, "slo_latency_ms": dep.slo_latency_ms or "",
            "profile": dep.profile, "selector": ", ".join(f"{k}={v}" for k, v in dep.selector.items()),
            "max_batch_size": dep.max_batch_size, "max_batch_delay_ms": dep.max_batch_delay_ms,
            "idle_timeout_s": dep.idle_timeout_s}
    if dep.latency_critical:
        form["latency_critical"] = "on"
    if dep.standby:
        form["standby"] = "on"
    return {k: v for k, v in (form | changes).items() if v is not None}


def row(html: str, index: int) -> str:
    match = re.search(rf'<tr data-replica="{index}".*?</tr>', html, re.S)
    assert match, f"no row for replica {index}"
    return re.sub(r"\s+", " ", match.group(0))


def stat(html: str, name: str) -> str:
    match = re.search(rf'<div class="stat" data-stat="{name}">(.*?)</div>', html, re.S)
    assert match, f"no stat {name}"
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", match.group(1))).strip()


def test_the_page_needs_a_login_and_an_existing_deployment(user_client, fleet):
    anonymous = Client()
    for url in ("/deployments/chat/", "/deployments/chat/status/"):
        assert anonymous.get(url).status_code == 302
    assert anonymous.post("/deployments/chat/policy/", {"priority": "batch"}).status_code == 302
    assert Deployment.objects.get(name="chat").priority == "critical"
    assert user_client.get("/deployments/ghost/").status_code == 404


def test_a_poll_after_signing_out_sends_the_browser_to_the_login_page(fleet):
    r = Client().get("/deployments/chat/status/", HTTP_HX_REQUEST="true",
                     HTTP_HX_CURRENT_URL="http://testserver/deployments/chat/")
    assert r.status_code == 200 and r["HX-Redirect"] == "/accounts/login/?next=%2Fdeployments%2Fchat%2F"
    assert r.content == b""


def test_the_page_polls_its_status_fragment_but_not_the_form(user_client, fleet):
    html = user_client.get("/deployments/chat/").content.decode()
    status = html.index('id="deployment-status"')
    assert 'hx-get="/deployments/chat/status/" hx-trigger="every 2s"' in html[status - 200:status + 200]
    policy = html.index('id="policy"')
    assert html.count('hx-trigger="every 2s"') == 1 and policy > html.index('id="replicas"')
    assert 'hx-post="/deployments/chat/policy/"' in html and 'hx-target="closest .card"' in html


def test_the_status_fragment_is_only_the_status_for_htmx_and_the_page_otherwise(user_client, fleet):
    fragment = user_client.get("/deployments/chat/status/", **HTMX)
    html = fragment.content.decode()
    assert fragment.status_code == 200 and "HX-Request" in fragment["Vary"]
    assert html.startswith('<section id="deployment-status"') and "<html" not in html and 'id="policy"' not in html
    full = user_client.get("/deployments/chat/status/").content.decode()
    assert "<html" in full and 'id="policy"' in full


def test_polling_stops_once_the_deployment_is_deleted(user_client, fleet):
    Deployment.objects.filter(name="chat").delete()
    r = user_client.get("/deployments/chat/status/", **HTMX)
    assert r.status_code == 286 and "was deleted" in r.content.decode()
    assert user_client.get("/deployments/chat/status/").status_code == 404


def test_the_status_shows_traffic_slo_and_the_replica_range(user_client, fleet):
    html = user_client.get("/deployments/chat/status/", **HTMX).content.decode()
    assert stat(html, "traffic") == "Traffic 48.2 req/s summed over hosts"
    latency = stat(html, "latency")
    assert re.fullmatch(r"p95 latency / target 340 ms / 200 ms violating since \d\d:\d\d for 3 min", latency)
    assert stat(html, "replicas") == "Replicas 3 of 1–4 scaled up 3 min ago"
    assert stat(html, "priority") == "Priority critical latency-critical · compute-bound"
    assert stat(html, "state").endswith("2 ready · 1 loading")

    html = user_client.get("/deployments/embed/status/", **HTMX).content.decode()
    assert stat(html, "latency").startswith("p95 latency / target 21 ms / 50 ms within SLO since 41 min ago")
    assert stat(html, "replicas") == "Replicas 2 fixed a fixed count: min = max"
    html = user_client.get("/deployments/nightly-batch/status/", **HTMX).content.decode()
    assert stat(html, "latency") == "p95 latency – no SLO"


def test_each_replica_shows_its_state_progress_decision_and_memory(user_client, fleet):
    html = user_client.get("/deployments/chat/status/", **HTMX).content.decode()
    ready, loading = row(html, 0), row(html, 2)
    assert 'class="pill state-ready">ready' in ready and "MPS 72%" in ready and "pid 4121" in ready
    assert 'class="tag action action-keep"' in ready and "kept on gpu-a/0: it still fits" in ready
    assert "estimated 20.00 GiB" in ready and "calibrated from 6 loads" in ready and "measured 18.40 GiB" in ready
    assert 'aria-valuenow="42"' in loading and "42% · 7.50 GiB of 17.80 GiB" in loading
    assert "→" not in loading  # loading toward ready goes without saying
    assert "added for the SLO" in loading and 'action-place' in loading

    waking = row(user_client.get("/deployments/summarize/status/", **HTMX).content.decode(), 0)
    assert 'state-sleeping">sleeping</span> <span class="toward" title="the scheduler wants it ready">→ ready' in waking
    assert "holds 86.7 MiB of host RAM while asleep" in waking and "slept 86.7 MiB in 33 ms (2.55 GiB/s)" in waking

    asleep = row(user_client.get("/deployments/nightly-batch/status/", **HTMX).content.decode(), 0)
    assert "<strong>gpu-a</strong>" in asleep and "host RAM" in asleep and "action-preempt" in asleep
    assert "preempted by chat#2" in asleep and "slept 8.00 GiB in 2.90 s" in asleep
    assert "nothing reserved on a GPU</span>, measured 8.20 GiB</div>" in asleep  # no error without an estimate

    preloaded = row(user_client.get("/deployments/embed/status/", **HTMX).content.decode(), 1)
    assert 'state-preloaded">preloaded' in preloaded and "→ ready" in preloaded
    assert "woke 5.10 GiB in 410 ms" in preloaded

    refused = row(user_client.get("/deployments/big/status/", **HTMX).content.decode(), 0)
    assert "not placed" in refused and "action-refuse" in refused and "needs 92.00 GiB" in refused


def test_the_adapters_card_sums_requests_over_replicas_and_shows_tiers_and_refusals(user_client, model_dir):
    scene(str(model_dir), adapter_error="adapter 'legal' has rank 64, above the pool's largest slot (rank 32)")
    html = user_client.get("/deployments/chat/").content.decode()
    sql = re.sub(r"\s+", " ", re.search(r'<tr data-adapter="sql">.*?</tr>', html, re.S).group(0))
    assert "#0 gpu" in sql and "#1 gpu" in sql and "<td class=\"num\" data-requests>2100</td>" in sql
    assert "140 / 5" in sql and "(97% hits)" in sql and "pinned" in sql
    support = re.sub(r"\s+", " ", re.search(r'<tr data-adapter="support">.*?</tr>', html, re.S).group(0))
    assert "#0 cpu" in support and "data-requests>40<" in support
    assert "Replica 1 refused an adapter: adapter &#x27;legal&#x27; has rank 64" in html


def test_the_policy_form_shows_the_stored_policy(user_client, fleet):
    Deployment.objects.filter(name="chat").update(selector={"gpu": "h100", "zone": "eu-1"})
    html = user_client.get("/deployments/chat/").content.decode()
    assert '<option value="critical" selected>' in html
    assert 'name="slo_latency_ms" type="number" min="1" class="num" placeholder="none" value="200"' in html
    assert 'value="gpu=h100, zone=eu-1"' in html and 'name="latency_critical" checked' in html
    assert '<option value="compute" selected>' in html


def test_an_htmx_policy_change_is_stored_and_the_card_says_what_changed(user_client, fleet):
    dep = fleet["embed"]
    r = user_client.post("/deployments/embed/policy/", policy_form(
        dep, priority="critical", slo_latency_ms="120", min_replicas="1", max_replicas="3",
        selector="gpu=h100 , zone = eu-1", max_batch_delay_ms="2.5"), **HTMX)
    html = r.content.decode()
    assert r.status_code == 200 and "<html" not in html and html.startswith('<section class="card policy" id="policy">')
    dep.refresh_from_db()
    assert (dep.priority, dep.slo_latency_ms, dep.min_replicas, dep.max_replicas) == ("critical", 120, 1, 3)
    assert dep.selector == {"gpu": "h100", "zone": "eu-1"} and dep.max_batch_delay_ms == 2.5
    assert 'class="msg-success"' in html
    assert "priority standard → critical" in html and "p95 target 50 ms → 120 ms" in html
    assert "selector none → gpu=h100, zone=eu-1" in html and "max batch delay 5 ms → 2.5 ms" in html
    assert 'value="120"' in html and '<option value="critical" selected>' in html
    # The status is refreshed out of band with the new target and priority.
    oob = html[html.index('<section id="deployment-status"'):]
    assert 'hx-swap-oob="true"' in oob[:400] and "/ 120 ms</span>" in oob and "prio-critical" in oob


def test_the_policy_form_sets_tolerations_and_spread(user_client, fleet):
    r = user_client.post("/deployments/embed/policy/", policy_form(
        fleet["embed"], tolerations="pool=ml, team=*", spread="required"), **HTMX)
    html = r.content.decode()
    dep = Deployment.objects.get(name="embed")
    assert dep.tolerations == {"pool": "ml", "team": "*"} and dep.spread == "required"
    assert "tolerations none → pool=ml, team=*" in html and "spread preferred → required" in html
    assert 'value="pool=ml, team=*"' in html and '<option value="required" selected>' in html


def test_saving_an_unchanged_form_says_so(user_client, fleet):
    r = user_client.post("/deployments/chat/policy/", policy_form(fleet["chat"]), **HTMX)
    assert "Nothing changed." in r.content.decode()


def test_unchecking_latency_critical_and_emptying_the_target_removes_them(user_client, fleet):
    form = policy_form(fleet["chat"], slo_latency_ms="")
    del form["latency_critical"]
    user_client.post("/deployments/chat/policy/", form, **HTMX)
    dep = Deployment.objects.get(name="chat")
    assert dep.slo_latency_ms is None and dep.latency_critical is False


@pytest.mark.parametrize("changes, field, message", [
    ({"min_replicas": "5", "max_replicas": "2"}, "max_replicas", "max_replicas 2 is below min_replicas 5"),
    ({"selector": "gpu h100"}, "selector", "selector: &#x27;gpu h100&#x27; is not key=value"),
    ({"selector": "gpu=h100, gpu=a100"}, "selector", "label &#x27;gpu&#x27; is given twice"),
    ({"tolerations": "pool"}, "tolerations", "tolerations: &#x27;pool&#x27; is not key=value"),
    ({"spread": "zone"}, "spread", "spread: input should be &#x27;preferred&#x27;, &#x27;required&#x27; or "
     "&#x27;none&#x27;"),
    ({"priority": "urgent"}, "priority", "priority: input should be &#x27;critical&#x27;, &#x27;high&#x27;"),
    ({"slo_latency_ms": "fast"}, "slo_latency_ms", "slo_latency_ms must be a whole number"),
    ({"max_batch_delay_ms": "20000"}, "max_batch_delay_ms", "max_batch_delay_ms: input should be less than or equal "
     "to 10000, got 20000.0"),
    ({"gpus_per_replica": "0"}, "gpus_per_replica", "gpus_per_replica: input should be greater than or equal to 1"),
    ({"idle_timeout_s": "0"}, "idle_timeout_s", "idle_timeout_s: input should be greater than or equal to 1, got 0"),
    ({"slo_latency_ms": "0"}, "slo_latency_ms", "slo_latency_ms: input should be greater than or equal to 1"),
    ({"idle_timeout_s": "soon"}, "idle_timeout_s", "idle_timeout_s must be a whole number, got &#x27;soon&#x27;"),
])
def test_a_refused_policy_change_names_the_field_and_stores_nothing(user_client, fleet, changes, field, message):
    before = Deployment.objects.values().get(name="chat")
    r = user_client.post("/deployments/chat/policy/", policy_form(fleet["chat"], **{"priority": "batch"} | changes),
                         **HTMX)
    html = r.content.decode()
    assert r.status_code == 200 and 'class="msg-error" role="alert"' in html
    assert message in html and "Nothing was changed." in html
    assert Deployment.objects.values().get(name="chat") == before
    # The input at fault is marked and what was typed is still there.
    assert re.search(rf'name="{field}"[^>]*aria-invalid="true"', html)
    assert html.count('aria-invalid="true"') == 1
    if field == "selector":
        assert f'value="{changes["selector"]}"' in html
    if field != "priority":
        assert '<option value="batch" selected>' in html  # what was typed, not what is stored (critical)


def test_without_javascript_a_change_redirects_back_with_a_message(user_client, fleet):
    r = user_client.post("/deployments/embed/policy/", policy_form(fleet["embed"], priority="high"))
    assert r.status_code == 302 and r["Location"] == "/deployments/embed/#policy"
    html = user_client.get(r["Location"]).content.decode()
    assert 'class="msg-success">Saved: priority standard → high.' in html
    assert Deployment.objects.get(name="embed").priority == "high"


def test_without_javascript_a_refusal_redirects_back_with_the_reason(user_client, fleet):
    before = Deployment.objects.values().get(name="embed")
    r = user_client.post("/deployments/embed/policy/", policy_form(fleet["embed"], priority="high",
                                                                     max_batch_size="0"), follow=True)
    assert r.redirect_chain == [("/deployments/embed/#policy", 302)]
    html = r.content.decode()
    assert ('class="msg-error">Policy not saved: max_batch_size: input should be greater than or equal to 1, got 0'
            in html)
    assert Deployment.objects.values().get(name="embed") == before


def test_the_policy_view_takes_only_posts(user_client, fleet):
    assert user_client.get("/deployments/chat/policy/").status_code == 405
    assert user_client.post("/deployments/ghost/policy/", {}).status_code == 404


def test_the_policy_form_stages_a_deployment_on_standby(user_client, fleet):
    dep = Deployment.objects.get(name="chat")
    r = user_client.post(f"/deployments/{dep.name}/policy/", policy_form(dep, standby="on"), HTTP_HX_REQUEST="true")
    html = r.content.decode()
    assert r.status_code == 200 and 'name="standby" checked' in html and "standby no → yes" in html
    assert Deployment.objects.get(name="chat").standby is True


def test_each_deployment_says_what_its_next_request_meets(user_client, fleet):
    expected = {"chat": "ready answers at once",
                "summarize": "waking a replica is on its way to a GPU; requests wait for it",
                "nightly-batch": "asleep in host RAM; the next request wakes it",
                "big": "cold on disk; the next request loads it"}
    for name, words in expected.items():
        html = user_client.get(f"/deployments/{name}/status/", **HTMX).content.decode()
        assert stat(html, "serving") == f"Serving {words}", name
        word = words.split()[0]
        assert f'class="serving serving-{word}" data-serving="{word}"' in html
    Deployment.objects.filter(name="chat").update(standby=True)
    html = user_client.get("/deployments/chat/status/", **HTMX).content.decode()
    assert stat(html, "serving").startswith("Serving standby loaded, but takes no requests")


def test_the_serving_tile_says_when_the_last_request_came(user_client, fleet):
    Deployment.objects.filter(name="chat").update(last_request_at=timezone.now() - timedelta(minutes=2))
    html = user_client.get("/deployments/chat/status/", **HTMX).content.decode()
    assert stat(html, "serving") == "Serving ready answers at once · last request 2 min ago"


def test_a_deployment_that_may_scale_to_zero_shows_its_idle_timeout(user_client, fleet):
    html = user_client.get("/deployments/nightly-batch/status/", **HTMX).content.decode()
    assert stat(html, "replicas") == "Replicas 1 of 0–2 not scaled yet · scales to zero after 5 min idle"
    Deployment.objects.filter(name="nightly-batch").update(idle_timeout_s=5400)
    html = user_client.get("/deployments/nightly-batch/status/", **HTMX).content.decode()
    assert stat(html, "replicas").endswith("scales to zero after 90 min idle")
    html = user_client.get("/deployments/chat/status/", **HTMX).content.decode()
    assert "scales to zero" not in html  # its minimum is 1: it never does


def test_waiting_requests_show_with_the_schedulers_answer_while_the_gateway_renews_them(user_client, fleet):
    Deployment.objects.filter(name="nightly-batch").update(
        demand=2, demand_at=timezone.now(), demand_status="waiting",
        demand_reason="waiting for std#0 to go idle (minimum residency: 30 s on its GPU)")
    html = user_client.get("/deployments/nightly-batch/status/", **HTMX).content.decode()
    box = re.sub(r"\s+", " ", re.search(r'<p class="demand-box.*?</p>', html, re.S).group(0))
    assert 'data-demand="waiting"' in box and ">queued</span>" in box
    assert "2 requests waiting: waiting for std#0 to go idle (minimum residency: 30 s on its GPU)" in box

    Deployment.objects.filter(name="nightly-batch").update(
        demand=1, demand_status="refused", demand_reason="needs 92.00 GiB; the largest free space is 63.00 GiB")
    html = user_client.get("/deployments/nightly-batch/status/", **HTMX).content.decode()
    assert 'data-demand="refused"' in html and "cannot be served now" in html
    assert "1 request waiting: needs 92.00 GiB" in html

    Deployment.objects.filter(name="nightly-batch").update(demand_at=timezone.now() - timedelta(seconds=30))
    html = user_client.get("/deployments/nightly-batch/status/", **HTMX).content.decode()
    assert "data-demand" not in html and "waiting:" not in html


def test_the_policy_form_shows_the_idle_timeout_and_takes_a_scale_to_zero_change(user_client, fleet):
    html = user_client.get("/deployments/embed/").content.decode()
    assert re.search(r'name="idle_timeout_s" type="number" min="1" max="604800" required class="num" value="300"', html)
    assert "with min replicas 0, the replicas leave their GPUs after this long without requests" in html
    r = user_client.post("/deployments/embed/policy/", policy_form(
        fleet["embed"], min_replicas="0", max_replicas="1", idle_timeout_s="600"), **HTMX)
    html = r.content.decode()
    dep = Deployment.objects.get(name="embed")
    assert (dep.min_replicas, dep.max_replicas, dep.idle_timeout_s) == (0, 1, 600)
    assert "min replicas 2 → 0" in html and "idle timeout 300 s → 600 s" in html
    assert "scales to zero after 10 min idle" in html  # the status, refreshed out of band


def log_picker(html: str) -> tuple[str, list[str], str | None]:
    """The Worker logs card's replica picker: the signature it carries, its options' texts, the one selected."""
    options = re.findall(r'<option value="(\d+)"( selected)?>([^<]*)</option>', html)
    signature = re.search(r'<input type="hidden" name="log_options" id="log-options" value="([^"]*)"', html)
    assert signature, "no picker signature"
    return signature.group(1), [text for _, _, text in options], next((v for v, s, _ in options if s), None)


def test_the_status_poll_carries_the_log_picker_and_leaves_it_while_its_replicas_stay_as_they_are(user_client, fleet):
    html = user_client.get("/deployments/chat/").content.decode()
    status = html.index('id="deployment-status"')
    assert 'hx-include="#log-replica, #log-options"' in html[status - 300:status + 300]
    signature, options, _ = log_picker(html)
    assert options == ["#0 · ready on gpu-a", "#1 · ready on gpu-b", "#2 · loading on gpu-a"]
    poll = user_client.get("/deployments/chat/status/", {"replica": "1", "log_options": signature}, **HTMX)
    assert 'id="worker-logs"' not in poll.content.decode()


def test_the_log_picker_follows_replicas_that_change_keeping_the_one_chosen(user_client, fleet):
    from console.deployments.models import Replica

    signature, _, _ = log_picker(user_client.get("/deployments/chat/").content.decode())
    dep = Deployment.objects.get(name="chat")
    Replica.objects.filter(deployment=dep, index=2).update(observed_state="ready")
    Replica.objects.create(deployment=dep, index=3)  # the scheduler's next replica, not placed yet
    html = user_client.get("/deployments/chat/status/", {"replica": "1", "log_options": signature},
                           **HTMX).content.decode()
    card = html[html.index('<section class="card worker-logs" id="worker-logs" hx-swap-oob="true"'):]
    new_signature, options, chosen = log_picker(card)
    assert options == ["#0 · ready on gpu-a", "#1 · ready on gpu-b", "#2 · ready on gpu-a", "#3 · pending, not placed"]
    assert chosen == "1" and new_signature != signature
    again = user_client.get("/deployments/chat/status/", {"replica": "1", "log_options": new_signature}, **HTMX)
    assert 'id="worker-logs"' not in again.content.decode()
