from channels.auth import AuthMiddlewareStack
from django.urls import path

from console.realtime.consumers import AgentConsumer, DashboardConsumer
from console.realtime.origin import SameOriginValidator

websocket_urlpatterns = [
    # Agents are machines: no Origin header, authenticated by bearer token instead.
    path("ws/agent/", AgentConsumer.as_asgi()),
    # Browsers: the console's own origin exactly (or a CSRF-trusted one), session-authenticated.
    path("ws/dashboard/", SameOriginValidator(AuthMiddlewareStack(DashboardConsumer.as_asgi()))),
]
