"""What the control plane does when a domain app announces a change (console/changes.py)."""

from console import changes
from console.control import desired, rollout
from console.realtime import notify


def _wake(**_) -> None:
    notify.wake_scheduler()


def _mark_stale(deployments, **_) -> None:
    desired.mark_stale(deployments)


def _begin_rollout(deployments, **_) -> None:
    rollout.begin_rollout(deployments)


def subscribe() -> None:
    changes.placement_wanted.connect(_wake, dispatch_uid="control.wake")
    changes.desired_stale.connect(_mark_stale, dispatch_uid="control.mark_stale")
    changes.rollout_wanted.connect(_begin_rollout, dispatch_uid="control.begin_rollout")
