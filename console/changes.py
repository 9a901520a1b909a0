"""Change signals: how a domain app says that something the control plane or the browsers act on has changed.

The apps above subscribe when they start (console/control/subscribers.py), so no
domain app imports them. Each signal is Django's, sent at once: its receivers run in the sender's thread and
transaction, as a direct call would; a sender that announces on commit wraps the call in transaction.on_commit.
"""

from django.dispatch import Signal

placement_wanted = Signal()  # something a scheduler pass plans with changed: it should run now, not at its tick
desired_stale = Signal()  # deployments=: their specs changed, so their hosts' desired states are rebuilt
rollout_wanted = Signal()  # deployments=: their artifacts are about to change, so their replicas roll onto them
routes_changed = Signal()  # the gateways' routes or deployments changed: they refresh their snapshot of the fleet
agent_token_replaced = Signal()  # host_id=: the host's agent token was rotated or revoked: its links end


def wake_scheduler() -> None:
    """Ask for a scheduler pass now (best effort; a lost one is the next tick's)."""
    placement_wanted.send(__name__)


def mark_stale(deployments) -> None:
    """These deployments' specs changed (a list or a queryset): inside the transaction that changed them, their
    hosts are marked for the next pass to rebuild."""
    desired_stale.send(__name__, deployments=deployments)


def begin_rollout(deployments) -> None:
    """These deployments' artifacts are about to change (their rows locked by the caller, before the change): each
    placed replica holds what it runs, and the scheduler rolls them onto the new artifacts one at a time."""
    rollout_wanted.send(__name__, deployments=deployments)


def refresh_gateways() -> None:
    """Every console process's gateway re-reads the fleet (its routes and deployments) now."""
    routes_changed.send(__name__)


def revoke_links(host_id: int) -> None:
    """The host's agent token changed (on commit): every console process ends the links made with the old one."""
    agent_token_replaced.send(__name__, host_id=host_id)
