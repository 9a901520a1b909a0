"""The Policy and SLO form's text to policy changes and back (pure helpers, no database)."""

import pytest

from console.deployments.models import Deployment
from console.deployments.policy_form import (
    describe_changes,
    format_selector,
    parse_policy_form,
    parse_selector,
    stored_policy,
)
from console.errors import Invalid


@pytest.mark.parametrize("text, selector", [
    ("", {}),
    ("  ", {}),
    ("gpu=h100", {"gpu": "h100"}),
    ("gpu = h100 ,zone=eu-1,", {"gpu": "h100", "zone": "eu-1"}),
    ("gpu=h100\nzone=eu-1", {"gpu": "h100", "zone": "eu-1"}),
    ("gpu=h100, gpu=h100", {"gpu": "h100"}),
    ("tier=a=b", {"tier": "a=b"}),
])
def test_it_reads_a_selector(text, selector):
    assert parse_selector(text) == selector


@pytest.mark.parametrize("text, message", [
    ("gpu", "selector: 'gpu' is not key=value"),
    ("=h100", "selector: '=h100' is not key=value"),
    ("gpu=", "selector: 'gpu=' is not key=value"),
    ("gpu=h100, gpu=a100", "selector: label 'gpu' is given twice ('h100' and 'a100')"),
])
def test_it_refuses_a_selector_it_cannot_read_and_says_how_to_write_one(text, message):
    with pytest.raises(Invalid, match="selector") as e:
        parse_selector(text)
    assert str(e.value).startswith(message)


def test_a_selector_reads_back_as_it_is_written():
    assert format_selector({"gpu": "h100", "zone": "eu-1"}) == "gpu=h100, zone=eu-1"
    assert parse_selector(format_selector({"gpu": "h100", "zone": "eu-1"})) == {"gpu": "h100", "zone": "eu-1"}
    assert format_selector({}) == format_selector(None) == ""


def test_it_turns_the_form_into_policy_changes():
    changes = parse_policy_form({"priority": "high", "min_replicas": "1", "max_replicas": " 3 ",
                                 "gpus_per_replica": "2", "slo_latency_ms": "250", "latency_critical": "on",
                                 "profile": "memory",
                                 "selector": "gpu=a100", "max_batch_size": "16", "max_batch_delay_ms": "2.5"})
    assert changes == {"priority": "high", "min_replicas": 1, "max_replicas": 3, "gpus_per_replica": 2,
                       "slo_latency_ms": 250, "latency_critical": True, "profile": "memory",
                       "selector": {"gpu": "a100"}, "tolerations": {}, "max_batch_size": 16, "max_batch_delay_ms": 2.5,
                       "standby": False}


def test_empty_fields_clear_the_slo_and_the_flags_and_leave_counts_alone():
    changes = parse_policy_form({"slo_latency_ms": "", "min_replicas": "", "selector": ""})
    assert changes == {"slo_latency_ms": None, "latency_critical": False, "standby": False, "profile": "",
                       "selector": {}, "tolerations": {}}


@pytest.mark.parametrize("form, message", [
    ({"min_replicas": "two"}, "min_replicas must be a whole number, got 'two'"),
    ({"max_batch_size": "1.5"}, "max_batch_size must be a whole number, got '1.5'"),
    ({"max_batch_delay_ms": "soon"}, "max_batch_delay_ms must be a number of milliseconds, got 'soon'"),
    ({"idle_timeout_s": "5 min"}, "idle_timeout_s must be a whole number, got '5 min'"),
])
def test_it_refuses_numbers_it_cannot_read_naming_the_field(form, message):
    with pytest.raises(Invalid) as e:
        parse_policy_form(form)
    assert str(e.value) == message
    assert e.value.fields == list(form)  # the page points at the input


def test_it_reads_the_idle_timeout_and_leaves_it_alone_when_empty():
    assert parse_policy_form({"min_replicas": "0", "idle_timeout_s": " 600 "})["idle_timeout_s"] == 600
    assert "idle_timeout_s" not in parse_policy_form({"idle_timeout_s": ""})


def test_a_changed_idle_timeout_is_described_in_seconds():
    # A team given, so that no default team is read: these rows are never saved.
    before = stored_policy(Deployment(min_replicas=1, idle_timeout_s=300, team_id=0))
    after = Deployment(min_replicas=0, idle_timeout_s=600, team_id=0)
    assert describe_changes(before, after) == ["min replicas 1 → 0", "idle timeout 300 s → 600 s"]
