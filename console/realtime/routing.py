from channels.sessions import CookieMiddleware
from django.urls import path

from console.control.agent_link import AgentConsumer
from console.realtime.consumers import DashboardConsumer
from console.realtime.origin import SameOriginValidator

websocket_urlpatterns = [
    # Agents are machines: no Origin header, authenticated by bearer token instead.
    path("ws/agent/", AgentConsumer.as_asgi()),
    # Browsers: the console's own origin exactly (or a CSRF-trusted one), session-authenticated by the consumer on
    # a thread of the browsers' own (console/realtime/browsers.py), not Channels' AuthMiddleware on its one thread.
    path("ws/dashboard/", SameOriginValidator(CookieMiddleware(DashboardConsumer.as_asgi()))),
]
