from console.control.checks import scheduler_settings


def test_an_unknown_strategy_is_a_system_check_error(settings):
    settings.MODELGRID_STRATEGY = "random"
    [error] = scheduler_settings(None)
    assert error.id == "modelgrid.E001" and "'random'" in error.msg and "memory-optimized" in error.hint


def test_the_defaults_pass(settings):
    assert scheduler_settings(None) == []
