from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from console.realtime.consumers import AgentConsumer, DashboardConsumer

websocket_urlpatterns = [
    # Agents are machines: no Origin header, authenticated by bearer token instead.
    path("ws/agent/", AgentConsumer.as_asgi()),
    # Browsers: same-origin only, session-authenticated.
    path("ws/dashboard/", AllowedHostsOriginValidator(AuthMiddlewareStack(DashboardConsumer.as_asgi()))),
]
