"""The store: change-only points, fill-forward reads, 5-minute means, pruning and outages."""

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from console.errors import Invalid
from console.series.models import Clock, Point, Series
from console.series.store import MAX_POINTS, _thin, prune, read_points, read_sum, record

pytestmark = pytest.mark.django_db
T0 = 1_800_000_000 - 1_800_000_000 % 300  # a 5-minute window starts here
RATE = ("deployment", 7, "request_rate")
P95 = ("deployment", 7, "p95_ms")
RESERVED = ("host", 3, "reserved_bytes")


def ticks(values_at: dict[int, dict], every: int = 10):
    """Record each {offset: values} at T0 + offset."""
    for offset, values in sorted(values_at.items()):
        record(values, T0 + offset)


def fine(key=RATE, since=T0 - 60, now=None):
    return read_points(key[0], key[1], key[2], since, now=now or T0 + 10_000)


def stored(key=RATE, coarse=False):
    series = Series.objects.get(kind=key[0], object_id=key[1], metric=key[2])
    return list(Point.objects.filter(series=series, coarse=coarse).order_by("t").values_list("t", "value"))


def test_it_writes_a_point_only_when_a_value_changes():
    ticks({0: {RATE: 1.0}, 10: {RATE: 1.0}, 20: {RATE: 2.5}, 30: {RATE: 2.5}})
    assert stored() == [(T0, 1.0), (T0 + 20, 2.5)]


def test_a_quiet_series_costs_nothing_after_its_first_point():
    written = [record({RATE: 0.0, P95: None, RESERVED: 8 << 30}, T0 + 10 * i).points for i in range(20)]
    assert written[0] == 3 and sum(written[1:]) == 0


def test_readers_fill_forward_to_the_last_tick():
    ticks({0: {RATE: 1.0}, 10: {RATE: 1.0}, 20: {RATE: 2.0}, 30: {RATE: 2.0}, 40: {RATE: 2.0}})
    read = fine(since=T0 + 5, now=T0 + 45)
    assert read.resolution_s == 10
    assert read.points == [(T0 + 5, 1.0), (T0 + 20, 2.0), (T0 + 40, 2.0)]


def test_a_series_starts_where_its_first_point_is():
    ticks({100: {RATE: 3.0}, 110: {RATE: 3.0}})
    assert fine(since=T0, now=T0 + 120).points == [(T0 + 100, 3.0), (T0 + 110, 3.0)]


def test_jitter_below_three_significant_digits_is_not_a_change():
    ticks({0: {P95: 123.41}, 10: {P95: 123.44}, 20: {P95: 124.9}})
    assert stored(P95) == [(T0, 123.0), (T0 + 20, 125.0)]


def test_bytes_stay_exact():
    ticks({0: {RESERVED: (8 << 30) + 1}, 10: {RESERVED: (8 << 30) + 2}})
    assert [v for _, v in stored(RESERVED)] == [(8 << 30) + 1, (8 << 30) + 2]


def test_an_object_that_is_gone_gets_a_gap_once():
    ticks({0: {RATE: 1.0, P95: 5.0}, 10: {P95: 5.0}, 20: {P95: 5.0}})
    assert stored() == [(T0, 1.0), (T0 + 10, None)]
    assert fine(since=T0, now=T0 + 30).points == [(T0, 1.0), (T0 + 10, None)]


def test_the_five_minute_point_is_the_time_weighted_mean_of_its_window():
    # 10 for the first 150 s, 20 for the rest: mean 15; the window closes at the first tick after it.
    ticks({o: {RATE: 10.0 if o < 150 else 20.0} for o in range(0, 310, 10)})
    assert stored(coarse=True) == [(T0, 15.0)]


def test_an_unchanged_window_writes_no_five_minute_point():
    ticks({o: {RATE: 4.0} for o in range(0, 910, 10)})
    assert stored(coarse=True) == [(T0, 4.0)]
    assert stored() == [(T0, 4.0)]


def test_a_window_mean_counts_only_the_seconds_with_a_reading():
    ticks({o: {P95: 40.0 if o < 100 else None} for o in range(0, 310, 10)})
    assert stored(P95, coarse=True) == [(T0, 40.0)]


def test_a_long_range_reads_five_minute_points():
    ticks({o: {RATE: 10.0 if o < 300 else 30.0} for o in range(0, 1210, 10)})
    read = read_points(*RATE, T0 - 2 * 86400, now=T0 + 1210)
    assert read.resolution_s == 300
    # The window holding the last tick is still open: the last readable one started at T0 + 900.
    assert read.points == [(T0, 10.0), (T0 + 300, 30.0), (T0 + 900, 30.0)]


def test_pruning_drops_old_points_but_not_the_value_in_force():
    with override_settings(MODELGRID_SERIES_FINE_RETENTION_SECONDS=3600):
        ticks({0: {RATE: 1.0, P95: 7.0}, 10: {RATE: 2.0, P95: 7.0}, 4000: {RATE: 3.0, P95: 7.0}})
        deleted = prune(T0 + 4000)
        assert deleted == 3  # the first tick's two points and the change at T0 + 10
        assert stored() == [(T0 + 4000, 3.0)]
        # p95 has not changed since T0: read an hour back, it still holds.
        assert fine(P95, since=T0 + 3000, now=T0 + 4005).points == [(T0 + 3000, 7.0), (T0 + 4000, 7.0)]


def test_five_minute_points_outlive_ten_second_ones():
    with override_settings(MODELGRID_SERIES_FINE_RETENTION_SECONDS=3600,
                           MODELGRID_SERIES_COARSE_RETENTION_SECONDS=7200):
        ticks({0: {RATE: 1.0}, 310: {RATE: 1.0}, 5000: {RATE: 2.0}})
        prune(T0 + 5000)
        assert stored(coarse=True) == [(T0, 1.0)]
        prune(T0 + 7500)
        assert stored(coarse=True) == []


def test_an_outage_breaks_the_line_instead_of_carrying_the_value_across():
    ticks({0: {RATE: 5.0}, 10: {RATE: 5.0}, 600: {RATE: 5.0}, 610: {RATE: 5.0}})
    assert fine(since=T0, now=T0 + 615).points == [(T0, 5.0), (T0 + 20, None), (T0 + 600, 5.0), (T0 + 610, 5.0)]


def test_an_unknown_metric_is_refused_naming_the_ones_there_are():
    with pytest.raises(Invalid) as refused:
        read_points("host", 3, "p95_ms", T0)
    assert "reserved_bytes" in refused.value.errors[0]["msg"] and refused.value.errors[0]["loc"] == ["query", "metric"]


def test_a_read_is_bounded():
    points = [(T0 + i, float(i)) for i in range(3 * MAX_POINTS)]
    thinned = _thin(points, MAX_POINTS)
    assert len(thinned) <= MAX_POINTS + 1 and thinned[-1] == points[-1]


def test_a_series_has_no_value_before_its_first_point_even_inside_a_closed_window():
    ticks({290: {RATE: 0.0}, 300: {RATE: 5.0}})  # window 0 closes at T0 + 300 with a mean from T0 + 290 on
    assert fine(since=T0 + 285, now=T0 + 305).points == [(T0 + 290, 0.0), (T0 + 300, 5.0)]


def test_a_value_whose_ten_second_point_was_pruned_reads_back_from_the_five_minute_mean():
    with override_settings(MODELGRID_SERIES_FINE_RETENTION_SECONDS=3600):
        ticks({o: {RATE: 1.0 if o < 4000 else 3.0} for o in range(0, 4010, 10)})
        prune(T0 + 4000)
        assert stored() == [(T0 + 4000, 3.0)]
        assert fine(since=T0 + 3000, now=T0 + 4005).points == [(T0 + 3000, 1.0), (T0 + 4000, 3.0)]


def reads_every_series(queries) -> bool:
    return any('"series_series"."kind"' in q["sql"] for q in queries)


def test_a_tick_after_this_process_recorded_the_last_one_compares_with_it_instead_of_reading_every_series():
    ticks({0: {RATE: 1.0, P95: 5.0}})
    with CaptureQueriesContext(connection) as queries:
        ticks({10: {RATE: 2.0, P95: 5.0}})
    assert not reads_every_series(queries.captured_queries)
    ticks({20: {RATE: 2.0}})  # p95's object is gone
    assert stored() == [(T0, 1.0), (T0 + 10, 2.0)]
    assert stored(P95) == [(T0, 5.0), (T0 + 20, None)]


def test_a_tick_after_another_hand_recorded_reads_every_series_again():
    ticks({0: {RATE: 1.0}})
    # Another console led meanwhile and recorded 5.0 at T0 + 10: this process's memory of the last tick is stale.
    Series.objects.filter(kind=RATE[0], object_id=RATE[1], metric=RATE[2]).update(value=5.0, since=T0 + 10)
    Clock.objects.update(last_tick=T0 + 10)
    with CaptureQueriesContext(connection) as queries:
        ticks({20: {RATE: 5.0}})
    assert reads_every_series(queries.captured_queries)
    assert stored() == [(T0, 1.0)]  # 5.0 is in force already: no point written


def test_a_series_pruned_away_is_created_again_when_its_object_reappears():
    with override_settings(MODELGRID_SERIES_COARSE_RETENTION_SECONDS=600):
        ticks({0: {RATE: 1.0}, 10: {}, 310: {}})  # gone at T0 + 10; the tick at 310 closes the first window
        prune(T0 + 1000, thorough=True)
        assert not Series.objects.filter(kind=RATE[0], object_id=RATE[1], metric=RATE[2]).exists()
        ticks({320: {RATE: 3.0}})
        assert stored() == [(T0 + 320, 3.0)]


def test_a_sum_of_series_holds_at_each_time_the_sum_of_the_values_in_force_then():
    a, b = ("team", 1, "request_rate"), ("team", 2, "request_rate")
    ticks({0: {a: 1.0, b: None}, 10: {a: 1.0, b: 2.0}, 20: {a: 3.0, b: 2.0}, 30: {a: 3.0, b: 2.0}})
    summed = read_sum([a[:2], b[:2]], "request_rate", T0 - 5, now=T0 + 35)
    assert summed.resolution_s == 10
    assert summed.points == [(T0, 1.0), (T0 + 10, 3.0), (T0 + 20, 5.0), (T0 + 30, 5.0)]
    assert read_sum([a[:2]], "request_rate", T0 - 5, now=T0 + 35) == fine(a, since=T0 - 5, now=T0 + 35)
    assert read_sum([], "request_rate", T0 - 5, now=T0 + 35).points == []  # a member of no team sees no traffic


def test_the_fine_step_is_the_chores_period():
    from console.control.chores import CHORE_SECONDS
    from console.series.store import FINE_STEP_S

    assert FINE_STEP_S == CHORE_SECONDS  # one sample per chore tick
