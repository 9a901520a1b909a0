"""The template filters that write figures for people."""

from datetime import timedelta

import pytest
from django.utils import timezone

from console.fleet.templatetags.units import age, ago, duration, gib, ms, per_second, rate


@pytest.mark.parametrize("seconds, text", [
    (1, "just now"), (40, "40 s ago"), (190, "3 min ago"), (7300, "2 h ago"), (86400, "1 day ago"),
    (5 * 86400 + 60, "5 days ago"),
])
def test_ago(seconds, text):
    assert ago(timezone.now() - timedelta(seconds=seconds)) == text


def test_age_and_an_unknown_time():
    assert ago(None) == age(None) == "–"
    assert age(timezone.now() - timedelta(seconds=190)) == "3 min"


@pytest.mark.parametrize("seconds, text", [(0.0331, "33 ms"), (0.0004, "0.4 ms"), (2.9, "2.90 s"), (None, "–")])
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_rates_and_sizes():
    assert gib(86.7 * 2**20) == "86.7 MiB" and gib(8 * 2**30) == "8.00 GiB"
    assert per_second(2.74e9) == "2.55 GiB/s" and per_second(None) == "–"
    assert ms(340.2) == "340 ms" and ms(4.25) == "4.2 ms" and ms(None) == "–"
    assert rate(0) == "0 req/s" and rate(0.031) == "0.03 req/s" and rate(48.25) == "48.2 req/s"
    assert rate(1310.4) == "1,310 req/s"
