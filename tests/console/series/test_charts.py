"""Charts as inline SVG: points drawn, the SLO line, the empty state, axis ticks with units, bounded output."""

import re

from console.series.charts import COLUMNS, Line, chart, fmt, nice_step, resample

T = 1_800_000_000


def test_a_step_series_is_resampled_as_time_weighted_means():
    # 2 until T + 40, then 4: the second quarter is 15 s of 2 and 10 s of 4.
    columns = resample([(T, 2.0), (T + 40, 4.0)], T, T + 100, hold=60, columns=4)
    assert columns == [2.0, (15 * 2 + 10 * 4) / 25, 4.0, 4.0]


def test_a_line_ends_where_its_last_point_stops_holding():
    columns = resample([(T, 2.0), (T + 40, 4.0), (T + 60, 4.0)], T, T + 100, hold=10, columns=4)
    assert columns == [2.0, (15 * 2 + 10 * 4) / 25, 4.0, None]


def test_a_gap_and_the_time_before_the_first_point_have_no_value():
    columns = resample([(T + 25, 1.0), (T + 50, None), (T + 75, 3.0)], T, T + 100, hold=25, columns=4)
    assert columns == [None, 1.0, None, 3.0]


def test_points_become_a_path_and_the_data_attributes_say_how_many():
    c = chart("request_rate", "Request rate", "req/s",
              [Line("rate", "requests", [(T, 1.0), (T + 600, 3.0), (T + 1190, 3.0)])], T, T + 1200, 10)
    assert not c["empty"] and c["points"] == 3 and c["last"] == 3.0 and c["max"] == 3.0
    path = c["paths"][0]["d"]
    assert path.startswith("M") and path.count("L") == COLUMNS - 1  # one unbroken line across the range
    assert [t["label"] for t in c["y_ticks"]][-1].endswith("req/s")


def test_the_slo_target_is_drawn_and_fits_on_the_scale():
    c = chart("latency", "Latency", "ms", [Line("p95", "p95", [(T, 40.0)])], T, T + 600, 10, target=200,
              target_label="SLO p95 200 ms")
    assert c["target"]["label"] == "SLO p95 200 ms"
    assert c["y1"] <= c["target"]["y"] < c["y0"]  # inside the plot, though every point is far below it
    assert float(c["y_ticks"][-1]["label"].split()[0]) >= 200


def test_without_a_target_there_is_no_target_line():
    c = chart("latency", "Latency", "ms", [Line("p95", "p95", [(T, 40.0)])], T, T + 600, 10)
    assert c["target"] is None


def test_no_readings_is_the_empty_state():
    c = chart("latency", "Latency", "ms", [Line("p95", "p95", [(T, None), (T + 60, None)])], T, T + 600, 10)
    assert c["empty"] and c["points"] == 0


def test_stacked_lines_sit_on_top_of_each_other():
    c = chart("replicas", "Replicas", "replicas", [Line("ready", "ready", [(T, 2.0)]),
                                                   Line("sleeping", "sleeping", [(T, 1.0)]),
                                                   Line("failed", "failed", [(T, 0.0)])],
              T, T + 600, 10, stacked=True)
    ready_y = float(c["paths"][0]["d"].split()[1])
    top_y = float(c["paths"][1]["d"].split()[1])
    assert top_y < ready_y  # 3 stacked is higher on screen than 2
    assert c["paths"][1]["area"].endswith("Z")
    assert c["paths"][2]["d"] == ""  # no failed replicas: no red edge drawn over the others


def test_hover_bands_carry_the_values_at_their_time():
    c = chart("latency", "Latency", "ms", [Line("p50", "p50", [(T, 12.0)]), Line("p95", "p95", [(T, 48.0)])],
              T, T + 3600, 10)
    assert re.search(r"\d\d:\d\d–\d\d:\d\d UTC · p50 12 ms · p95 48 ms", c["bands"][0]["title"])


def test_time_ticks_are_a_few_and_read_as_times_or_days():
    hour = chart("x", "X", "ms", [Line("a", "a", [(T, 1.0)])], T, T + 3600, 10)["x_ticks"]
    week = chart("x", "X", "ms", [Line("a", "a", [(T, 1.0)])], T, T + 7 * 86400, 300)["x_ticks"]
    assert 3 <= len(hour) <= 7 and re.fullmatch(r"\d\d:\d\d", hour[0]["label"])
    assert 3 <= len(week) <= 8 and re.fullmatch(r"[A-Z][a-z]{2} \d\d", week[0]["label"])


def test_values_read_with_their_units():
    assert fmt(80 << 30, "bytes") == "80 GiB" and fmt(1.5 * (1 << 40), "bytes") == "1.5 TiB"
    assert fmt(340.0, "ms") == "340 ms" and fmt(0.25, "req/s") == "0.25 req/s" and fmt(3.0, "replicas") == "3"
    assert fmt(None, "ms") == "–"
    assert nice_step(100) == 20 and nice_step(12) == 2.5 and nice_step(7) == 2


def test_a_share_is_drawn_against_the_whole():
    c = chart("utilization", "GPU utilisation", "%", [Line("util", "mean", [(T, 12.0)])], T, T + 600, 10)
    assert c["y_ticks"][-1]["label"] == "100%"


def test_bytes_at_zero_read_as_whole_units_not_fractions_of_a_byte():
    c = chart("memory", "GPU memory", "bytes", [Line("reserved", "reserved", [(T, 0.0)])], T, T + 600, 10)
    labels = [tick["label"] for tick in c["y_ticks"]]
    assert labels[-1] == "2 GiB" and not any("e-" in label for label in labels)


def test_a_thousand_mib_reads_without_an_exponent():
    assert fmt(1000 * (1 << 20), "bytes") == "1000 MiB"
