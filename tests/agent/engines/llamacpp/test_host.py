"""host.py reads llama-server's flags into xllamacpp's CommonParams: every flag launch.py writes and settings.py
allows sets its field, with each value a deployment may give; anything else is refused, saying which."""

from __future__ import annotations

import pytest

from agent.engines.llamacpp.settings import ALLOWLIST
from agent.protocol.engine_args.kinds import Choice, Float, Int

from .conftest import needs_server
from .test_server import _spec

pytestmark = needs_server


def _values(kind) -> list[str]:
    if isinstance(kind, Choice):
        return list(kind.values)
    if isinstance(kind, (Int, Float)):
        return [str(kind.low), str(kind.high)]
    raise AssertionError(kind)


def _field(params, field: str):
    owner, _, name = field.rpartition(".")
    return getattr(getattr(params, owner) if owner else params, name)


def test_every_flag_a_deployment_may_set_sets_its_field_with_every_kind_of_value():
    from agent.engines.llamacpp import host

    for flag in ALLOWLIST.switches:
        field, value = host.SWITCHES[flag]
        assert _field(host.params([flag]), field) == value, flag
    for flag, kind in ALLOWLIST.valued.items():
        field, _ = host.VALUED[flag]
        for value in _values(kind):
            made = _field(host.params([flag, value]), field)
            assert made == host.VALUED[flag][1](value), (flag, value)


def test_the_command_line_a_replica_starts_with_is_read_whole(tmp_path):
    from agent.engines.llamacpp import host

    spec = _spec(tmp_path / "m.gguf")
    made = host.params([*spec.engine_args, "--port", "5000"], key="secret")
    assert made.model.path == str(tmp_path / "m.gguf") and made.model_alias == {"tiny"}
    assert made.hostnames == ["127.0.0.1"] and made.port == 5000 and made.api_keys == ["secret"]
    assert made.n_ctx == 256 and made.n_parallel == 2 and made.n_gpu_layers == 0
    assert made.endpoint_metrics and not made.endpoint_slots and not made.ui


@pytest.mark.parametrize("argv, says", [(["--lora", "x"], "unknown flag --lora"), (["--ctx-size"], "needs a value")])
def test_a_flag_it_does_not_take_ends_it_saying_which(argv, says, capsys):
    from agent.engines.llamacpp import host

    assert host.main(argv) == 2
    assert says in capsys.readouterr().err
