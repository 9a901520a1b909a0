from console.catalog.calibration import MAX_RATIO, NONE, WINDOW, correction, error_fraction


def test_without_loads_there_is_no_correction():
    assert correction([]) == NONE
    assert NONE.apply(1000) == 1000


def test_one_load_corrects_by_its_own_ratio():
    corr = correction([(1000, 1100)])
    assert (corr.factor, corr.samples) == (1.1, 1)
    assert corr.apply(2000) == 2200


def test_it_takes_the_90th_percentile_so_admission_errs_on_the_generous_side():
    pairs = [(100, 100 + i) for i in range(10)]  # ratios 1.00 .. 1.09
    assert correction(pairs).factor == 1.08  # nearest rank: the 9th of 10


def test_only_the_most_recent_loads_count():
    recent = [(100, 90)] * WINDOW
    old = [(100, 300)] * 5
    corr = correction(recent + old)
    assert (corr.factor, corr.samples) == (0.9, WINDOW)


def test_a_ratio_that_measured_something_else_does_not_steer_admission():
    corr = correction([(100, int(100 * MAX_RATIO) + 1), (100, 105)])
    assert (corr.factor, corr.samples) == (1.05, 1)


def test_the_error_is_relative_to_the_measurement():
    assert error_fraction(110, 100) == 0.1
    assert error_fraction(90, 100) == -0.1
    assert error_fraction(None, 100) is None and error_fraction(100, None) is None
