import pytest

from agent.gpus import SimulatedBackend, make_backend, parse_sim_spec

GIB = 1 << 30


def test_it_parses_a_count_and_a_size():
    assert [g.total_bytes for g in parse_sim_spec("sim:2x24GiB")] == [24 * GIB, 24 * GIB]


def test_it_parses_several_groups_in_order_and_decimal_units():
    gpus = parse_sim_spec("sim:1x80GiB, 2x512MiB,1x16GB")
    assert [g.total_bytes for g in gpus] == [80 * GIB, 512 << 20, 512 << 20, 16 * 10**9]


def test_it_takes_a_size_without_a_count_as_one_gpu():
    assert [g.total_bytes for g in parse_sim_spec("sim:1.5GiB")] == [int(1.5 * GIB)]


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("2x24GiB", "must start with 'sim:'"),
        ("sim:", "names no GPUs"),
        ("sim:2x24XB", "unknown size unit 'XB'"),
        ("sim:0x24GiB", "at least 1"),
        ("sim:2x0GiB", "above zero"),
        ("sim:twox24GiB", "is not COUNTxSIZE"),
        ("sim:2x24GiB,", "is not COUNTxSIZE"),
        ("sim:100x1GiB", "at most 64"),
    ],
)
def test_it_refuses_a_bad_spec_naming_the_problem(spec, problem):
    with pytest.raises(ValueError, match=problem.replace("(", r"\(")):
        parse_sim_spec(spec)


def test_it_reports_what_its_workers_measured_as_used():
    backend = SimulatedBackend("sim:1x80GiB,1x24GiB", host="box")
    gpus = backend.collect({1: 123_456})
    assert [(g.index, g.uuid, g.name, g.total_bytes, g.used_bytes, g.simulated) for g in gpus] == [
        (0, "SIM-box-0", "Simulated GPU 80 GiB", 80 * GIB, 0, True),
        (1, "SIM-box-1", "Simulated GPU 24 GiB", 24 * GIB, 123_456, True),
    ]
    assert backend.device_kind == "cpu" and backend.is_available()


def test_make_backend_builds_a_simulation_and_refuses_unknown_kinds():
    assert isinstance(make_backend("sim:1x1GiB", host="h"), SimulatedBackend)
    with pytest.raises(ValueError, match="unknown GPU backend 'rocm'"):
        make_backend("rocm")
