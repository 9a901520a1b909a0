"""What the control plane does when a domain app announces a change (console/changes.py): in this process (the
scheduler, desired state, rollouts) and, over the channel layer, in the others (gateways, agent links)."""

from asgiref.sync import async_to_sync

from console import changes
from console.control import desired, hub, layer, rollout


def _wake(**_) -> None:
    hub.wake_scheduler()


def _mark_stale(deployments, **_) -> None:
    desired.mark_stale(deployments)


def _begin_rollout(deployments, **_) -> None:
    rollout.begin_rollout(deployments)


def _refresh_gateways(**_) -> None:
    async_to_sync(layer.refresh_gateways)()


def _revoke_links(host_id: int, **_) -> None:
    layer.revoke_links(host_id)


def subscribe() -> None:
    changes.placement_wanted.connect(_wake, dispatch_uid="control.wake")
    changes.desired_stale.connect(_mark_stale, dispatch_uid="control.mark_stale")
    changes.rollout_wanted.connect(_begin_rollout, dispatch_uid="control.begin_rollout")
    changes.routes_changed.connect(_refresh_gateways, dispatch_uid="control.refresh_gateways")
    changes.agent_token_replaced.connect(_revoke_links, dispatch_uid="control.revoke_links")
