"""The Helm chart (deploy/helm/modelgrid), rendered in-process by real Helm (helm-python-sdk) for each worked value
set in deploy/helm/values/, and the rendered objects held to the rules: no secret as a plain env value, probes on
every container that serves, agents only on GPU nodes, more than one console only on PostgreSQL and Redis, non-root
and locked down. The manifests pass kubernetes-validate --strict, the value sets the schema, the YAML yamllint."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from pathlib import Path

import helm_python as helm
import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("chart_render", ROOT / "deploy" / "helm" / "render.py")
chart = sys.modules.setdefault("chart_render", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(chart)

SETS = chart.value_sets()
SECRET_NAME = re.compile(r"KEY|TOKEN|PASSWORD|SECRET|CREDENTIAL|DATABASE_URL|REDIS_URL", re.IGNORECASE)
POD_KINDS = ("Deployment", "DaemonSet", "Job")


def render(values: dict) -> list[dict]:
    return chart.objects(chart.render(values))


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict], kind: str, component: str) -> dict:
    [found] = [o for o in by_kind(objects, kind) if o["metadata"]["labels"]["app.kubernetes.io/component"] == component]
    return found


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def containers(spec: dict) -> list[dict]:
    return spec.get("initContainers", []) + spec["containers"]


@pytest.fixture(scope="module", params=sorted(SETS))
def rendered(request) -> tuple[str, dict, list[dict]]:
    values = chart.load_values(SETS[request.param])
    return request.param, chart.helm.Chart.load(chart.CHART).merge_values(values), render(values)


def test_there_are_the_three_worked_value_sets():
    assert {"minimal", "production", "vllm"} <= set(SETS)


def test_no_secret_is_a_plain_env_value(rendered):
    _, values, objects = rendered
    for obj in (o for o in objects if o["kind"] in POD_KINDS):
        secret_volumes = {v["name"] for v in pod_spec(obj)["volumes"] if "secret" in v}
        for c in containers(pod_spec(obj)):
            secret_dirs = [m["mountPath"] for m in c["volumeMounts"] if m["name"] in secret_volumes]
            for env in c.get("env", []):
                if env["name"].endswith("_FILE"):  # a path (SECRET_KEY_FILE), to a file of a mounted Secret
                    assert any(env["value"].startswith(d + "/") for d in secret_dirs), env
                elif SECRET_NAME.search(env["name"]):
                    assert "value" not in env, f"{obj['metadata']['name']}/{c['name']}: {env['name']} as a plain value"
                    assert set(env["valueFrom"]) == {"secretKeyRef"}, env
                if env["name"] in ("DATABASE_URL", "REDIS_URL"):
                    assert "valueFrom" in env
            assert not any(SECRET_NAME.search(a) and "=" in a for a in c.get("args", []) + c.get("command", []))
    text = "\n".join(chart.render(chart.load_values(SETS[rendered[0]])).values())
    assert "postgres://" not in text and "redis://" not in text


def test_every_container_that_serves_has_probes_on_its_open_health_paths(rendered):
    from agent.serving.auth import OPEN_PATH
    from console.probes import LIVE_PATH, READY_PATH

    _, _, objects = rendered
    serving = [(o, c) for o in objects if o["kind"] in ("Deployment", "DaemonSet")
               for c in pod_spec(o)["containers"] if c.get("ports")]
    assert len(serving) == 2
    for obj, c in serving:
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert c[probe]["httpGet"]["port"] == c["ports"][0]["name"], (obj["metadata"]["name"], probe)
    console = pod_spec(one(objects, "Deployment", "console"))["containers"][0]
    assert console["livenessProbe"]["httpGet"]["path"] == LIVE_PATH
    assert console["readinessProbe"]["httpGet"]["path"] == READY_PATH
    agent = pod_spec(one(objects, "DaemonSet", "agent"))["containers"][0]
    assert agent["livenessProbe"]["httpGet"]["path"] == OPEN_PATH


def test_agents_run_only_on_gpu_nodes_with_the_gpus_and_the_nvidia_runtime(rendered):
    _, values, objects = rendered
    spec = pod_spec(one(objects, "DaemonSet", "agent"))
    assert spec["nodeSelector"] == values["agent"]["nodeSelector"] and spec["nodeSelector"]
    assert any(t["key"] == "nvidia.com/gpu" and t["effect"] == "NoSchedule" for t in spec["tolerations"])
    assert spec["runtimeClassName"] == "nvidia"
    [agent] = spec["containers"]
    gpus = agent["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == values["agent"]["gpusPerNode"] >= 1 and agent["resources"]["requests"]["nvidia.com/gpu"] == gpus


def test_the_agent_is_named_after_its_node_and_reads_that_nodes_token_from_the_secret(rendered):
    from agent.cli import build_parser

    _, values, objects = rendered
    spec = pod_spec(one(objects, "DaemonSet", "agent"))
    [agent] = spec["containers"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "MODELGRID_AGENT_TOKEN" not in env
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["tokens"]["secret"] == {"secretName": values["agent"]["tokens"]["existingSecret"],
                                           "defaultMode": 0o440}  # the agent refuses a world-readable file
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    # The real CLI takes the arguments the chart gives it (the image's entrypoint is `python -m agent run`).
    args = [a.replace("$(NODE_NAME)", "gpu-node-1").replace("$(POD_IP)", "10.1.2.3") for a in agent["args"]]
    parsed = build_parser().parse_args(["run", *args])
    assert parsed.name == "gpu-node-1" and parsed.token_file == f"{mounts['tokens']}/gpu-node-1"
    assert parsed.drain_timeout == values["agent"]["drainTimeout"] and parsed.stop_workers_on_exit
    assert parsed.listen == ("0.0.0.0", values["agent"]["port"]) and parsed.advertise == "http://10.1.2.3:8100"
    assert parsed.console.startswith("http://") and ".svc:" in parsed.console


def test_more_than_one_console_runs_on_postgresql_and_redis_after_the_migration_hook(rendered):
    from console.control.management.commands.up import Command

    _, values, objects = rendered
    deployment = one(objects, "Deployment", "console")
    [console] = pod_spec(deployment)["containers"]
    env = {e["name"]: e for e in console["env"]}
    opts = Command().create_parser("manage.py", "up").parse_args(console["command"][3:])  # python manage.py up ...
    jobs = by_kind(objects, "Job")
    if deployment["spec"]["replicas"] >= 2:
        assert values["database"]["kind"] == "postgresql"
        assert "secretKeyRef" in env["DATABASE_URL"]["valueFrom"] and "secretKeyRef" in env["REDIS_URL"]["valueFrom"]
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
        assert by_kind(objects, "PodDisruptionBudget")
    if values["database"]["kind"] == "postgresql":
        assert opts.no_migrate and "MODELGRID_ADMIN_PASSWORD" not in env
        [job] = jobs
        assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
        steps = [c["command"] for c in containers(pod_spec(job))]
        assert steps == [["python", "manage.py", "migrate", "--noinput"], ["python", "manage.py", "ensureadmin"]]
    else:  # one SQLite console migrates itself, on its own volume, and is replaced, not rolled
        assert deployment["spec"]["replicas"] == 1 and not opts.no_migrate and not jobs
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}
        assert "DATABASE_URL" not in env
    assert (opts.host, opts.port, opts.no_agent) == ("0.0.0.0", values["console"]["port"], True)


def test_grace_periods_cover_the_stops_they_bound(rendered):
    from console.control.management.commands.up import SHUTDOWN_DEADLINE

    _, values, objects = rendered
    console = pod_spec(one(objects, "Deployment", "console"))
    pre_stop = console["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert console["terminationGracePeriodSeconds"] >= pre_stop + SHUTDOWN_DEADLINE
    agent = pod_spec(one(objects, "DaemonSet", "agent"))
    assert agent["terminationGracePeriodSeconds"] >= values["agent"]["drainTimeout"] + 5


def test_every_pod_runs_as_non_root_without_privileges(rendered):
    _, _, objects = rendered
    for obj in (o for o in objects if o["kind"] in POD_KINDS):
        spec = pod_spec(obj)
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for c in containers(spec):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert sc["readOnlyRootFilesystem"] is True, c["name"]
            assert "privileged" not in sc


def test_the_model_store_is_mounted_read_only_at_the_model_roots_of_consoles_and_agents(rendered):
    _, values, objects = rendered
    root = values["modelStore"]["mountPath"]
    readers = [pod_spec(one(objects, "Deployment", "console"))["containers"][0],
               pod_spec(one(objects, "DaemonSet", "agent"))["containers"][0]]
    readers += [pod_spec(job)["initContainers"][0] for job in by_kind(objects, "Job")]  # data migrations read them
    for c in readers:
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["MODELGRID_MODEL_ROOTS"] == root
        assert {"name": "models", "mountPath": root, "readOnly": True} in c["volumeMounts"]


def test_generated_secrets_are_a_hook_before_the_migration_job_and_a_url_given_in_values_goes_into_it():
    objects = render({"database": {"url": "postgres://mg:hunter2@db:5432/mg"}, "redis": {"url": "redis://r:6379/0"}})
    [secret] = by_kind(objects, "Secret")
    assert secret["metadata"]["annotations"]["helm.sh/hook-weight"] == "-10"
    assert set(secret["data"]) == {"secret-key", "admin-password", "database-url", "redis-url"}
    assert "hunter2" not in str([o for o in objects if o["kind"] != "Secret"])
    [job] = by_kind(objects, "Job")
    assert int(job["metadata"]["annotations"]["helm.sh/hook-weight"]) > -10


@pytest.mark.parametrize("values, said", [
    ({"console": {"replicas": "two"}}, "at '/console/replicas': got string, want integer"),
    ({"console": {"replicas": 3}, "database": {"kind": "sqlite"}, "redis": {"enabled": False}},
     "console.replicas is 3: more than one console needs PostgreSQL"),
    ({"redis": {"enabled": False}}, "console.replicas is 2: more than one console needs Redis"),
    ({"console": {"env": {"SECRET_KEY": "x"}}}, "invalid propertyName 'SECRET_KEY'"),
    ({"agent": {"env": {"HF_TOKEN": "hf_x"}}}, "invalid propertyName 'HF_TOKEN'"),
    ({"console": {"podSecurityContext": {"runAsNonRoot": False}}}, "runAsNonRoot': value must be true"),
    ({"database": {"url": "mysql://x"}}, "/database/url"),
    ({"console": {"terminationGracePeriodSeconds": 12}}, "must cover preStopSleepSeconds (5) plus the 10 s"),
    ({"agent": {"resources": {"limits": {"memory": "64Gi"}}}}, "set agent.sleepBudget below it too"),
    ({"agent": {"nodeSelector": None}}, "at '/agent': missing property 'nodeSelector'"),
    ({"surprise": 1}, "additional properties 'surprise' not allowed"),
])
def test_values_that_cannot_work_are_refused_saying_why(values, said):
    with pytest.raises((helm.HelmValuesError, helm.HelmRenderError)) as refused:
        chart.render(values)
    assert said in str(refused.value)


def test_make_chart_checks_pass(tmp_path):
    """helm lint, kubernetes-validate --strict, check-jsonschema and yamllint, as `make chart` runs them."""
    results = chart.check_all(tmp_path)
    failed = [f"{r.check} ({r.subject}):\n{r.detail}" for r in results if not r.ok]
    assert not failed, "\n\n".join(failed)
    assert {r.check.split()[0] for r in results} >= {"helm", "kubernetes-validate", "check-jsonschema", "yamllint"}
    print(chart.table(results))


def test_the_validator_refuses_a_field_kubernetes_does_not_know(tmp_path):
    [daemonset] = [p for p in chart.write(chart.render({}), tmp_path) if p.name == "agent-daemonset.yaml"]
    daemonset.write_text(daemonset.read_text().replace("runtimeClassName:", "runtimeClasName:"))
    result = chart.kubernetes_validate("broken", [daemonset])
    assert not result.ok and "'runtimeClasName' was unexpected" in result.detail


def test_install_md_names_the_commands_it_documents():
    text = (ROOT / "docs" / "install.md").read_text()
    for needed in ("createagenttoken", "modelgrid-agent-tokens", "modelgrid-database", "make chart",
                   "nvidia.com/gpu.present", "runtimeClassName"):
        assert needed in text, needed
    installs = [shlex.split(line) for line in text.splitlines() if line.strip().startswith("helm install")]
    assert installs
    for words in installs:  # the chart and the value set it names are there
        assert (ROOT / words[3]).is_dir() and (ROOT / words[words.index("-f") + 1]).is_file(), words
