"""What the channel layer tells other console processes when a domain app announces a change (console/changes.py)."""

from asgiref.sync import async_to_sync

from console import changes
from console.realtime import notify


def _refresh_gateways(**_) -> None:
    async_to_sync(notify.refresh_gateways)()


def _revoke_links(host_id: int, **_) -> None:
    notify.revoke_links(host_id)


def subscribe() -> None:
    changes.routes_changed.connect(_refresh_gateways, dispatch_uid="realtime.refresh_gateways")
    changes.agent_token_replaced.connect(_revoke_links, dispatch_uid="realtime.revoke_links")
