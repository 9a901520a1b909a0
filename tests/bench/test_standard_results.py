"""`make bench`'s rows: GuideLLM's JSON report (a real one of 0.8.1, trimmed to what is read), the driver's own
request records, the ModelGrid / vLLM-direct ratios, and lm-eval's scores, read without running anything."""

import json
import math
from pathlib import Path

import pytest

from bench.standard.results import Record, Result, from_guidellm, from_records, ratios
from bench.standard.tools import lm_eval_scores

REPORT = Path(__file__).parent / "data" / "guidellm-0.8.1-report.json"


def test_it_reads_guidellms_percentiles_rates_and_errors():
    row = from_guidellm(json.loads(REPORT.read_text()), "fixed", "vLLM direct")
    assert (row.shape, row.target, row.tool) == ("fixed", "vLLM direct", "GuideLLM")
    assert row.ttft_p50_ms == pytest.approx(15.1927, abs=1e-3)
    assert row.ttft_p90_ms == pytest.approx(19.9149, abs=1e-3)
    assert row.itl_p50_ms == pytest.approx(1.6307, abs=1e-3)
    assert (row.output_tokens_per_s, row.requests_per_s, row.tokens_per_request) == (1152.0, 72.0, 16.0)
    assert (row.requests, row.errors) == (216, 0)  # the 3 cut off by the time limit are neither


def test_errored_requests_are_counted_and_no_successful_one_gives_no_figures():
    report = json.loads(REPORT.read_text())
    metrics = report["benchmarks"][0]["metrics"]
    metrics["request_totals"] |= {"successful": 0, "errored": 5}
    for name in ("time_to_first_token_ms", "inter_token_latency_ms", "output_tokens_per_second",
                 "requests_per_second", "output_token_count"):
        metrics[name]["successful"]["count"] = 0
    row = from_guidellm(report, "fixed", "t")
    assert (row.requests, row.errors) == (0, 5)
    assert math.isnan(row.ttft_p50_ms) and math.isnan(row.output_tokens_per_s)


def test_a_report_of_several_benchmarks_is_refused():
    report = json.loads(REPORT.read_text())
    report["benchmarks"] *= 2
    with pytest.raises(ValueError, match="found 2"):
        from_guidellm(report, "fixed", "t")


def test_records_give_nearest_rank_percentiles_and_rates_of_the_successful_requests():
    records = [Record(ttft_s=t / 1000, total_s=t / 1000 + 0.031, tokens=32) for t in range(10, 110, 10)]
    records.append(Record(ttft_s=5.0, total_s=5.0, tokens=0, error="503 cold"))
    row = from_records(records, wall_s=2.0, shape="LoRA split", target="t")
    assert (row.ttft_p50_ms, row.ttft_p90_ms) == pytest.approx((50.0, 90.0))
    assert row.itl_p50_ms == pytest.approx(1.0)
    assert (row.output_tokens_per_s, row.requests_per_s, row.tokens_per_request) == (160.0, 5.0, 32.0)
    assert (row.requests, row.errors, row.tool) == (10, 1, "driver")


def test_itl_weighs_each_request_by_its_gaps():
    # one long slow request outweighs two short fast ones, as GuideLLM counts it
    records = [Record(0.0, 0.002, 3), Record(0.0, 0.002, 3), Record(0.0, 0.99, 100)]
    assert from_records(records, 1.0, "s", "t").itl_p50_ms == pytest.approx(10.0)


def test_no_records_give_no_figures_and_no_division_by_zero():
    row = from_records([], 0.0, "s", "t")
    assert row.requests == 0 and math.isnan(row.ttft_p50_ms) and math.isnan(row.requests_per_s)
    assert row.as_dict()["ttft_p50_ms"] is None  # JSON has no NaN


def test_ratios_pair_each_shape_of_both_targets():
    results = [Result("a", "mg", ttft_p50_ms=20.0, itl_p50_ms=3.0, output_tokens_per_s=90.0),
               Result("a", "direct", ttft_p50_ms=10.0, itl_p50_ms=2.0, output_tokens_per_s=100.0),
               Result("b", "mg", ttft_p50_ms=5.0, output_tokens_per_s=1.0)]  # no direct row: no ratio
    assert ratios(results, "mg", "direct") == [{"shape": "a", "output tok/s ratio": 0.9, "TTFT p50 ratio": 2.0,
                                                "ITL p50 ratio": 1.5}]


def test_lm_eval_scores_drop_filters_and_standard_errors():
    report = {"results": {"modelgrid_tiny_mc": {"name": "modelgrid_tiny_mc", "sample_len": 8, "acc,none": 0.125,
                                                "acc_stderr,none": 0.125},
                          "modelgrid_tiny_gen": {"exact_match,none": 0.0, "exact_match_stderr,none": 0.0}}}
    assert lm_eval_scores(report) == {"modelgrid_tiny_gen": {"exact_match": 0.0}, "modelgrid_tiny_mc": {"acc": 0.125}}


def test_a_tools_log_loses_the_key_it_printed(tmp_path):
    from bench.standard.tools import _redact

    log = tmp_path / "lm_eval.log"
    log.write_text("headers: {'Authorization': 'Bearer mg_api_s3cret'}\nretrying\n")
    _redact(log, "mg_api_s3cret")
    assert "s3cret" not in log.read_text() and "Bearer [key]" in log.read_text()
