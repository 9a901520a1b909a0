"""Whether a deployment's engine can run its model somewhere in this fleet, asked when a deployment is saved.

The engines' capability checks (agent.engines: Engine.refusal) judged the model's files when it was registered
(Model.engine_refusals, by engine and device kind); what a host's engine runs on is known here: CUDA where it has
a real GPU, its CPU where its GPUs are simulated. A deployment is refused when its engine refuses the model on every
device kind, or on the kind of every host that runs that engine. With no host running the engine yet, only what no
device takes is refused: placement waits for a host, and an agent refuses a replica its device cannot run before
it starts one. `auto` is never refused: it picks the built-in engine where vLLM could not run the model
(console/control/desired.py)."""

from __future__ import annotations

from agent.artifacts.capability import DEVICES
from agent.engines import AUTO, BUILTIN, format_refusal
from console.catalog.memory import model_format
from console.catalog.models import Model
from console.errors import Invalid
from console.fleet.models import Gpu, Host

_ON = {"cpu": "on CPU", "cuda": "on CUDA GPUs"}


def engine_kinds(engine: str) -> frozenset[str]:
    """The device kinds ("cpu", "cuda") of the hosts whose agent runs `engine`."""
    hosts = Host.objects.filter(engines__has_key=engine)
    rows = Gpu.objects.filter(host__in=hosts).values_list("host_id", "simulated")
    real: dict[int, bool] = {}
    for host_id, simulated in rows:
        real[host_id] = real.get(host_id, False) or not simulated
    return frozenset("cuda" if r else "cpu" for r in real.values())


def engine_refusal(model: Model, engine: str, kinds: frozenset[str] | None = None) -> str:
    """Why no host could run `model` on `engine`, in words a person can act on; "" when one could. `kinds`: the
    device kinds of the hosts that run it (read when not given)."""
    if why := format_refusal(engine, model_format(model)):  # read now: a row may predate an engine of its format
        return f"model {model.name!r} cannot run on engine {engine}: {why}"
    refused = (model.engine_refusals or {}).get(engine) or {}
    if engine == AUTO or not refused:
        return ""
    advice = f"; deploy it with engine {BUILTIN.name} or {AUTO}" if engine != BUILTIN.name else ""
    if all(refused.get(device) for device in DEVICES):
        return f"model {model.name!r} cannot run on engine {engine}: {refused['cuda']}{advice}"
    kinds = engine_kinds(engine) if kinds is None else kinds
    if not kinds or not all(refused.get(kind) for kind in kinds):
        return ""
    kind = sorted(kinds)[0]
    on = _ON[kind] if len(kinds) == 1 else "on a device it refuses"
    return (f"model {model.name!r} cannot run on engine {engine} here: {refused[kind]} (every host that runs "
            f"{engine} runs it {on}){advice}")


def check_engine(model: Model, engine: str, kinds: frozenset[str] | None = None) -> None:
    """Invalid (on the `engine` field) when no host could run `model` on `engine` (engine_refusal)."""
    why = engine_refusal(model, engine, kinds)
    if why:
        raise Invalid(why, field="engine")
