"""ASGI entry point: HTTP through Django, websockets through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402  (needs the app registry)

from console.gateway.app import make_app  # noqa: E402
from console.gateway.mount import GatewayPaths  # noqa: E402
from console.probes import Probes  # noqa: E402
from console.realtime.routing import websocket_urlpatterns  # noqa: E402

# /livez and /readyz are answered first; inference (/v1, /v2) and /metrics go to the gateway; the rest is Django.
http = Probes(GatewayPaths(gateway=make_app(), django=django_asgi_app))
application = ProtocolTypeRouter({"http": http, "websocket": URLRouter(websocket_urlpatterns)})
