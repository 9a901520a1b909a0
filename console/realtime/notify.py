"""The names the domain apps and the gateway announce changes with, until console/changes.py takes them over: the
channel layer's groups and sends are console/control/layer.py, and the throttled ones are the hub's
(console/control/hub.py)."""

from console.control.hub import refresh_dashboards, wake_scheduler, wake_scheduler_async
from console.control.layer import (
    DASHBOARD_GROUP,
    GATEWAY_GROUP,
    SCHEDULER_GROUP,
    host_group,
    listen,
    recheck_browsers,
    refresh_gateways,
    revoke_links,
)

__all__ = ["DASHBOARD_GROUP", "GATEWAY_GROUP", "SCHEDULER_GROUP", "host_group", "listen", "recheck_browsers",
           "refresh_dashboards", "refresh_gateways", "revoke_links", "wake_scheduler", "wake_scheduler_async"]
