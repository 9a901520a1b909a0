"""A member's token reads the metrics of its teams' deployments only: samples naming another deployment (ours or
vLLM's `model_name`) are left out, comments and hosts' series kept; an admin's token reads everything."""

from console.gateway.auth import Caller
from console.gateway.fleet import DeploymentView, FleetView
from console.gateway.metrics_scope import scoped, visible

PAGE = b"""# HELP modelgrid_requests_total Requests.
# TYPE modelgrid_requests_total counter
modelgrid_requests_total{adapter="",deployment="chat-a",status="200"} 3.0
modelgrid_requests_total{adapter="",deployment="chat-b",status="200"} 5.0
vllm:num_requests_running{engine="0",model_name="chat-b"} 1.0
modelgrid_replica_state{deployment="gone",replica="gone#0",state="ready"} 1.0
modelgrid_gpu_memory_used_bytes{gpu="0"} 1024.0
"""


def _fleet() -> FleetView:
    return FleetView({name: DeploymentView(name, "standard", 2, "generate", "ready", (), (), team=team)
                      for name, team in (("chat-a", 1), ("chat-b", 2))})


def test_a_members_page_keeps_their_teams_deployments_and_the_hosts_series():
    member = Caller("k", "ann", "all", teams=frozenset({1}))
    text = scoped(PAGE, visible(member, _fleet())).decode()
    assert 'deployment="chat-a"' in text and "gpu_memory_used_bytes" in text and "# TYPE" in text
    assert "chat-b" not in text and "gone" not in text  # another team's, and one no longer in the fleet


def test_an_admins_page_is_left_whole():
    admin = Caller("k", "root", "all", teams=None)
    assert visible(admin, _fleet()) is None and scoped(PAGE, None) == PAGE
