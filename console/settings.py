"""Settings for the console; everything deployment-specific comes from environment variables."""

from __future__ import annotations

import os
import re
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from console.env import envbool, envfloat, envint, envsecret, envstr

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(envstr("MODELGRID_DATA_DIR", str(BASE_DIR / "var"))).resolve()
MODEL_STORE = Path(envstr("MODELGRID_MODEL_STORE", str(DATA_DIR / "models"))).resolve()
# Registration, estimates and adapters read artifacts only under these directories (symlinks resolved):
# a path list separated by ":" (default: the model store). Anything else is refused with one message.
MODEL_ROOTS = [Path(p).resolve() for p in envstr("MODELGRID_MODEL_ROOTS", str(MODEL_STORE)).split(":") if p]


def _private_dir(path: Path) -> None:
    """Create the data dir readable by its owner only: it holds the secret key and the database (sessions).
    A directory that already exists is left as the operator made it."""
    if not path.exists():
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o700)  # mkdir's mode is filtered through the umask; chmod is not


def _private_file(path: Path) -> None:
    """Create `path` (empty) as 0600 if it is missing, else take group and other access away from a file of
    ours. The mode is given at creation, so the file is never readable by others, whatever the umask."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        st = path.stat()
        if st.st_mode & 0o077 and st.st_uid == os.getuid():
            path.chmod(0o600)


def _secret_key() -> str:
    key = envsecret("SECRET_KEY")
    if key:
        return key
    # Embedded mode: one random key per data dir, kept so sessions survive restarts.
    key_file = DATA_DIR / "secret_key"
    if not key_file.exists():
        _private_dir(DATA_DIR)
        _private_file(key_file)
        key_file.write_text(secrets.token_urlsafe(50))
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = envbool("DEBUG", False)
ALLOWED_HOSTS = [h for h in envstr("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in envstr("CSRF_TRUSTED_ORIGINS", "").split(",") if o]


def _proxy_ssl_header() -> tuple[str, str] | None:
    """MODELGRID_PROXY_SSL_HEADER=X-Forwarded-Proto: the TLS proxy in front sets that header to `https`."""
    name = envstr("MODELGRID_PROXY_SSL_HEADER").strip()
    if not name:
        return None
    if not re.fullmatch(r"[A-Za-z0-9-]+", name):
        raise ImproperlyConfigured(f"MODELGRID_PROXY_SSL_HEADER={name!r} is not an HTTP header name "
                                   "(use the name alone, e.g. X-Forwarded-Proto; its value must be https)")
    return "HTTP_" + name.upper().replace("-", "_"), "https"


# Production behind TLS (docs/operations.md lists the values): all off by default, so the embedded mode
# keeps working on plain http://127.0.0.1.
SECURE_PROXY_SSL_HEADER = _proxy_ssl_header()
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", False)
SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", False)
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", False)
SECURE_CONTENT_TYPE_NOSNIFF = envbool("SECURE_CONTENT_TYPE_NOSNIFF", True)
SECURE_REFERRER_POLICY = envstr("SECURE_REFERRER_POLICY", "same-origin")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "channels",
    "django_htmx",
    "ninja",  # serves the API docs page from local static files (no CDN)
    "axes",
    "console.accounts",
    "console.fleet",
    "console.catalog",
    "console.deployments",
    "console.control",
    "console.realtime",
    "console.events",
    "console.series",
    "console.alerts",
    "console.routes",
    "console.usage",
]

MIDDLEWARE = [
    # First, so it sees every answer: errors under /api are the API's JSON, never an HTML or text page.
    "console.api_errors.api_json_errors",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: turns a refused sign-in of a locked-out username and address into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database() -> dict:
    url = envsecret("DATABASE_URL")
    if url:
        # A pool of connections (psycopg_pool), checked before each reuse. Connections opened per call cost a
        # fifth of a busy console's time; connections kept per thread (CONN_MAX_AGE) leak under ASGI, where
        # Django serves each request on a thread of its own: 1,000 hosts' API calls exhausted PostgreSQL's
        # max_connections ("too many clients") within 30 s. A pooled connection goes back when its call ends.
        config = dj_database_url.parse(url, conn_max_age=0, conn_health_checks=True)
        size = envint("MODELGRID_DB_POOL_SIZE", 16)
        if size < 2:
            raise ImproperlyConfigured(f"MODELGRID_DB_POOL_SIZE={size} must be at least 2")
        config.setdefault("OPTIONS", {})["pool"] = {"min_size": 2, "max_size": size, "timeout": 30}
        return config
    _private_dir(DATA_DIR)
    name = DATA_DIR / "modelgrid.sqlite3"
    # The database holds session keys and token hashes. SQLite gives its -wal and -shm files the database
    # file's mode, so a 0600 database file (created here before SQLite would make it 0644) keeps all three private.
    _private_file(name)
    for extra in (name.with_name(name.name + "-wal"), name.with_name(name.name + "-shm")):
        if extra.exists():
            _private_file(extra)
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": name,
        # WAL and immediate transactions: the console, the scheduler loop and management
        # commands share one file without "database is locked" on upgrade.
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        },
    }


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def _channel_layers() -> dict:
    url = envsecret("REDIS_URL")
    if not url:
        return {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    from console.realtime.redis_connection import CancellableConnection
    from console.realtime.redis_layer import ChannelLayer

    # channels_redis waits for a message with a blocking pop (BZPOPMIN) of RedisChannelLayer.brpop_timeout
    # seconds (5, a class attribute, not configurable), and redis-py reads every reply within the connection's
    # socket_timeout, which redis-py 8 (pinned) sets to 5 s by default. With equal values the read of an empty
    # pop's reply times out first: receive() raises redis.exceptions.TimeoutError, the consumer dies, and every
    # websocket (agent links included) drops about every 6 s. So the socket timeout exceeds the pop by a margin;
    # it still bounds a command on a dead Redis.
    pop = ChannelLayer.brpop_timeout
    host = {"address": url, "socket_timeout": 3 * pop, "socket_connect_timeout": 5,
            # A pooled connection idle this long (cut by a firewall or Redis's `timeout`) is pinged before use
            # instead of failing the command on it.
            "health_check_interval": 3 * pop,
            # redis-py 8 caps a pool at 100 connections and fails the command past that (MaxConnectionsError):
            # a thousand agent links joining, leaving and being pushed to at once need more.
            "max_connections": envint("MODELGRID_REDIS_MAX_CONNECTIONS", 1000),
            # Calls stay cancellable on Python 3.11 (see CancellableConnection): without it a websocket's
            # teardown could wait forever on a receive() that ignored its cancellation.
            "connection_class": CancellableConnection}
    return {
        "default": {
            # channels_redis's layer with one leak fixed (see console/realtime/redis_layer.py)
            "BACKEND": "console.realtime.redis_layer.ChannelLayer",
            "CONFIG": {"hosts": [host], "prefix": envstr("MODELGRID_CHANNEL_PREFIX", "modelgrid")},
        }
    }


CHANNEL_LAYERS = _channel_layers()

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out username and address before any password is checked (django-axes).
    "console.accounts.throttle.ThrottledSignIn",
    "django.contrib.auth.backends.ModelBackend",
]


def _at_least(name: str, value: float, least: float) -> float:
    if value < least:
        raise ImproperlyConfigured(f"{name}={value:g} must be at least {least:g}")
    return value


# Sign-in throttling (django-axes): this many wrong passwords for one username from one address lock that
# pair out for the cool-off; other users, other addresses, API tokens and open sessions are not affected.
AXES_FAILURE_LIMIT = int(_at_least("MODELGRID_LOGIN_FAILURE_LIMIT", envint("MODELGRID_LOGIN_FAILURE_LIMIT", 10), 1))
AXES_COOLOFF_TIME = timedelta(
    minutes=_at_least("MODELGRID_LOGIN_COOLOFF_MINUTES", envfloat("MODELGRID_LOGIN_COOLOFF_MINUTES", 15.0), 0.1)
)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "console.accounts.throttle.locked_out"
# Stores a bounded excerpt of each failed attempt (django-axes' own handler appends 2 KiB to one row per failure).
AXES_HANDLER = "console.accounts.throttle.BoundedRecords"
# The address a sign-in is counted under is REMOTE_ADDR, never a header a client may have written itself.
AXES_CLIENT_IP_CALLABLE = "console.accounts.throttle.client_address"
# `up` has uvicorn replace REMOTE_ADDR with X-Forwarded-For only from these proxies (comma-separated addresses or
# networks). uvicorn's own default trusts loopback, which in the embedded mode is every client, so one sent to a
# locked-out sign-in started a fresh count; here none is trusted unless named.
FORWARDED_ALLOW_IPS = envstr("FORWARDED_ALLOW_IPS", "").strip()
# Expired sessions, and sign-in records (django-axes' access logs, failure logs and attempts) older than this, are
# deleted by the scheduler leader's chores (console/accounts/retention.py); an attempt lasts its cool-off at least.
MODELGRID_SIGN_IN_RETENTION_DAYS = _at_least("MODELGRID_SIGN_IN_RETENTION_DAYS",
                                             envfloat("MODELGRID_SIGN_IN_RETENTION_DAYS", 30.0), 0.001)
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = envstr("MODELGRID_STATIC_ROOT") or None  # collectstatic target when served by a proxy
# Serve app and package static files without collectstatic in the embedded mode.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "modelgrid": {"handlers": ["console"], "level": envstr("MODELGRID_LOG_LEVEL", "INFO")},
        # A page's 500 with its traceback (Django's own handler prints it only with DEBUG on); 4xx stay quiet.
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}

# Scheduler loop and agent link.
# A pass runs whenever something changed (a wake-up); this is how often one runs when nothing does.
MODELGRID_SCHEDULER_INTERVAL = envfloat("MODELGRID_SCHEDULER_INTERVAL", 5.0)
# Such an unwoken pass plans only when something is due (an idle timeout, a residency, a cooldown ending), while any
# deployment has traffic, or this long after the last plan (the safety net of a level-triggered loop); otherwise
# it only checks leases (console/control/loop.py).
MODELGRID_SCHEDULER_RESYNC_SECONDS = envfloat("MODELGRID_SCHEDULER_RESYNC_SECONDS", 60.0)
MODELGRID_GPU_BUFFER_BYTES = envint("MODELGRID_GPU_BUFFER_BYTES", 0)
# Placement (console/scheduler, docs/placement.md): the strategy, and the pacing of replica-count changes.
MODELGRID_STRATEGY = envstr("MODELGRID_STRATEGY", "memory-optimized")
MODELGRID_QUIET_WINDOW_SECONDS = envfloat("MODELGRID_QUIET_WINDOW_SECONDS", 300.0)
MODELGRID_SCALE_COOLDOWN_SECONDS = envfloat("MODELGRID_SCALE_COOLDOWN_SECONDS", 120.0)
MODELGRID_SEARCH_BUDGET_SECONDS = envfloat("MODELGRID_SEARCH_BUDGET_SECONDS", 0.2)
# Host lifecycle (docs/operations.md): any message from an agent renews its host's lease; a host whose
# lease lapses (or whose link closes) is `unknown`: it keeps its replicas but gets no new ones. Only after
# the eviction timeout are its replicas re-placed, and no more than a share of the hosts per minute (a
# network partition must not move the whole fleet at once). After a console starts, nothing lapses until
# agents have had the reconnect grace to come back.
MODELGRID_HOST_LEASE_SECONDS = _at_least("MODELGRID_HOST_LEASE_SECONDS",
                                         envfloat("MODELGRID_HOST_LEASE_SECONDS", 20.0), 1.0)
MODELGRID_EVICTION_SECONDS = _at_least("MODELGRID_EVICTION_SECONDS", envfloat("MODELGRID_EVICTION_SECONDS", 60.0), 0.0)
MODELGRID_EVICTION_RATE = _at_least("MODELGRID_EVICTION_RATE", envfloat("MODELGRID_EVICTION_RATE", 0.1), 0.0)
MODELGRID_RECONNECT_GRACE_SECONDS = _at_least("MODELGRID_RECONNECT_GRACE_SECONDS",
                                              envfloat("MODELGRID_RECONNECT_GRACE_SECONDS", 30.0), 0.0)
# Agent messages are applied in batches: one transaction per tick for every link of this console process (an ack
# brings its batch forward at once: the push it answers is waiting for it).
MODELGRID_INTAKE_TICK_SECONDS = envfloat("MODELGRID_INTAKE_TICK_SECONDS", 0.02)
# A quiet report (nothing changed: it only renews a lease) may wait this long for its batch.
MODELGRID_INTAKE_QUIET_TICK_SECONDS = envfloat("MODELGRID_INTAKE_QUIET_TICK_SECONDS", 0.25)
# Browsers' live dashboards are re-rendered at most this often, however busy the fleet.
MODELGRID_DASHBOARD_REFRESH_SECONDS = envfloat("MODELGRID_DASHBOARD_REFRESH_SECONDS", 1.0)
# Live pages' websockets one console process holds, per user and in all (console/realtime/browsers.py): one more
# is accepted and closed at once with code 4429 and the reason, which the page shows.
MODELGRID_BROWSER_SOCKETS_PER_USER = int(_at_least("MODELGRID_BROWSER_SOCKETS_PER_USER",
                                                   envint("MODELGRID_BROWSER_SOCKETS_PER_USER", 20), 1))
MODELGRID_BROWSER_SOCKETS = int(_at_least("MODELGRID_BROWSER_SOCKETS", envint("MODELGRID_BROWSER_SOCKETS", 1000), 1))
# Scheduler leader election (console/control/leader.py): a console that does not lead tries again this often.
MODELGRID_LEADER_RETRY_SECONDS = _at_least("MODELGRID_LEADER_RETRY_SECONDS",
                                           envfloat("MODELGRID_LEADER_RETRY_SECONDS", 2.0), 0.1)

# The inference gateway (console/gateway, docs/inference.md).
MODELGRID_GATEWAY_QUEUE_WAIT_SECONDS = envfloat("MODELGRID_GATEWAY_QUEUE_WAIT_SECONDS", 60.0)
MODELGRID_GATEWAY_QUEUE_MAX = envint("MODELGRID_GATEWAY_QUEUE_MAX", 256)
MODELGRID_GATEWAY_TOKEN_CONCURRENCY = envint("MODELGRID_GATEWAY_TOKEN_CONCURRENCY", 64)
MODELGRID_GATEWAY_DEPLOYMENT_CONCURRENCY = envint("MODELGRID_GATEWAY_DEPLOYMENT_CONCURRENCY", 256)
MODELGRID_GATEWAY_MAX_BODY_BYTES = envint("MODELGRID_GATEWAY_MAX_BODY_BYTES", 16 * 1024 * 1024)
# How long the gateway waits on an agent: to connect; for an answer's headers (a non-streamed generation's come when
# it is done, so this stays above the agents' --generation-timeout, 300 s); and between two pieces of a streamed
# answer, the first included (a prompt's prefill and the engine's queue come before it).
MODELGRID_GATEWAY_CONNECT_TIMEOUT_SECONDS = _at_least("MODELGRID_GATEWAY_CONNECT_TIMEOUT_SECONDS",
                                                      envfloat("MODELGRID_GATEWAY_CONNECT_TIMEOUT_SECONDS", 5.0), 0.1)
MODELGRID_GATEWAY_RESPONSE_TIMEOUT_SECONDS = _at_least("MODELGRID_GATEWAY_RESPONSE_TIMEOUT_SECONDS",
                                                       envfloat("MODELGRID_GATEWAY_RESPONSE_TIMEOUT_SECONDS", 360.0),
                                                       0.1)
MODELGRID_GATEWAY_STREAM_IDLE_SECONDS = _at_least("MODELGRID_GATEWAY_STREAM_IDLE_SECONDS",
                                                  envfloat("MODELGRID_GATEWAY_STREAM_IDLE_SECONDS", 120.0), 0.1)
# Prompts that share a prefix go to the replica that was sent it, within the bounded-load bound (docs/inference.md).
MODELGRID_GATEWAY_PREFIX_ROUTING = envbool("MODELGRID_GATEWAY_PREFIX_ROUTING", True)
# Requests in flight per ready replica through one console; more wait at the gateway, by band and fair share between
# tokens (console/gateway/flow.py). Near the engine's batch: what waits beyond it waits here, where its order is kept.
MODELGRID_GATEWAY_REPLICA_SLOTS = int(_at_least("MODELGRID_GATEWAY_REPLICA_SLOTS",
                                                envint("MODELGRID_GATEWAY_REPLICA_SLOTS", 32), 1))
# `up`'s HTTP connections (console/connections.py): at most this many open (0: half the process's descriptor
# limit), each sending a request's headers within the first timeout and its body within the second.
MODELGRID_MAX_CONNECTIONS = int(_at_least("MODELGRID_MAX_CONNECTIONS", envint("MODELGRID_MAX_CONNECTIONS", 0), 0))
MODELGRID_HEADER_TIMEOUT_SECONDS = _at_least("MODELGRID_HEADER_TIMEOUT_SECONDS",
                                             envfloat("MODELGRID_HEADER_TIMEOUT_SECONDS", 10.0), 0.1)
MODELGRID_BODY_TIMEOUT_SECONDS = _at_least("MODELGRID_BODY_TIMEOUT_SECONDS",
                                           envfloat("MODELGRID_BODY_TIMEOUT_SECONDS", 60.0), 0.1)
# Temporal sharing by demand: a replica without requests this long is idle (it may sleep for an equal or
# higher tier's waiting requests); a replica just placed or woken keeps its GPU at least this long.
MODELGRID_IDLE_GRACE_SECONDS = envfloat("MODELGRID_IDLE_GRACE_SECONDS", 2.0)
MODELGRID_MIN_RESIDENCY_SECONDS = envfloat("MODELGRID_MIN_RESIDENCY_SECONDS", 5.0)
# Waiting requests renew their demand every second; a count older than this is stale (its console is gone).
MODELGRID_DEMAND_STALE_SECONDS = envfloat("MODELGRID_DEMAND_STALE_SECONDS", 5.0)

# The event timeline (console/events): the same event within this window is folded into one row with a count;
# events are kept this many days, and no more than this many rows (the oldest go first).
MODELGRID_EVENTS_FOLD_SECONDS = _at_least("MODELGRID_EVENTS_FOLD_SECONDS",
                                          envfloat("MODELGRID_EVENTS_FOLD_SECONDS", 600.0), 0.0)
MODELGRID_EVENTS_RETENTION_DAYS = _at_least("MODELGRID_EVENTS_RETENTION_DAYS",
                                            envfloat("MODELGRID_EVENTS_RETENTION_DAYS", 14.0), 0.01)
MODELGRID_EVENTS_MAX_ROWS = int(_at_least("MODELGRID_EVENTS_MAX_ROWS",
                                          envint("MODELGRID_EVENTS_MAX_ROWS", 200_000), 100))

# Charts over time (console/series/store.py): 10-second points are kept this long, 5-minute points this long.
MODELGRID_SERIES_FINE_RETENTION_SECONDS = _at_least("MODELGRID_SERIES_FINE_RETENTION_SECONDS",
                                                    envfloat("MODELGRID_SERIES_FINE_RETENTION_SECONDS", 86400.0), 600.0)
MODELGRID_SERIES_COARSE_RETENTION_SECONDS = _at_least("MODELGRID_SERIES_COARSE_RETENTION_SECONDS",
                                                      envfloat("MODELGRID_SERIES_COARSE_RETENTION_SECONDS",
                                                               30 * 86400.0), 3600.0)

# Usage accounting (console/usage/store.py): per-minute buckets are kept this many days, then rolled into hourly
# buckets, which are kept this many days.
MODELGRID_USAGE_MINUTE_RETENTION_DAYS = _at_least("MODELGRID_USAGE_MINUTE_RETENTION_DAYS",
                                                  envfloat("MODELGRID_USAGE_MINUTE_RETENTION_DAYS", 3.0), 0.1)
MODELGRID_USAGE_HOUR_RETENTION_DAYS = _at_least("MODELGRID_USAGE_HOUR_RETENTION_DAYS",
                                                envfloat("MODELGRID_USAGE_HOUR_RETENTION_DAYS", 400.0), 1.0)

# Alert webhooks reach public addresses only; these hosts (names or addresses, as the URL writes them) are exempt,
# e.g. an Alertmanager inside the cluster (console/alerts/targets.py).
MODELGRID_WEBHOOK_ALLOWED_HOSTS = [h.strip().lower().strip("[]").rstrip(".")
                                   for h in envstr("MODELGRID_WEBHOOK_ALLOWED_HOSTS", "").split(",") if h.strip()]
