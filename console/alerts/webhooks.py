"""Delivering what alerts owe their rules' webhooks: an outbox of POSTs in the database, sent by the scheduler
leader's chore loop from the event loop (aiohttp, never a database thread), each retried with doubling
backoff until delivered or given up; every delivery and every giving up is told on the timeline. Only public
addresses are reached (console/alerts/targets.py), and redirects are not followed."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

import aiohttp
from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone
from yarl import URL

from console.alerts.evaluate import _note
from console.alerts.models import WebhookDelivery
from console.alerts.targets import PublicResolver, RefusedTarget, literal_refusal
from console.events.record import record

log = logging.getLogger("modelgrid.alerts")
TIMEOUT_S = 5.0
FIRST_RETRY_S = 5.0
MAX_RETRY_S = 600.0
MAX_ATTEMPTS = 8  # 5 s, 10 s, 20 s, ... about 10 minutes of retries in all
PER_ROUND = 20  # deliveries sent per chore round, at once


def due(now: datetime) -> list[WebhookDelivery]:
    """The deliveries to attempt now (sync, DB)."""
    return list(WebhookDelivery.objects.filter(delivered_at=None, given_up_at=None, next_attempt_at__lte=now)
                .select_related("alert").order_by("next_attempt_at", "pk")[:PER_ROUND])


async def post(session: aiohttp.ClientSession, delivery: WebhookDelivery) -> str | None:
    """POST one delivery; None when the receiver took it (2xx), else why not. `session` must resolve names with
    PublicResolver (as deliver's does): addresses written in the URL are checked here."""
    try:
        refused = literal_refusal(URL(delivery.url).host or "")
        if refused:
            return refused
        # A redirect is not followed: its target would be reached unchecked.
        async with session.post(delivery.url, json=delivery.payload, allow_redirects=False,
                                headers={"User-Agent": "ModelGrid-alerts"}) as response:
            if 200 <= response.status < 300:
                return None
            said = f"HTTP {response.status} {response.reason or ''}".strip()
            if 300 <= response.status < 400:
                said += " (redirects are not followed: point the webhook at where it leads)"
            return said
    except aiohttp.ClientConnectorError as e:
        if isinstance(e.os_error, RefusedTarget):
            return str(e.os_error)
        return f"{type(e).__name__}: {e}"
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
        return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def settle(outcomes: list[tuple[WebhookDelivery, str | None]], now: datetime) -> None:
    """Record each attempt (sync, DB): delivered, retried later, or given up; the first and last on the timeline."""
    notes = []
    with transaction.atomic():
        for d, error in outcomes:
            d.attempts += 1
            status = d.payload.get("status", "?")
            if error is None:
                d.delivered_at = now
                notes.append(_note(d.alert.object, "WebhookDelivered", f"{status} alert {d.payload.get('alert')} "
                                   f"delivered to {d.url} (attempt {d.attempts})"))
            elif d.attempts >= MAX_ATTEMPTS:
                d.given_up_at, d.last_error = now, error[:1000]
                notes.append(_note(d.alert.object, "WebhookFailed", f"{status} alert {d.payload.get('alert')} not "
                                   f"delivered to {d.url} after {d.attempts} attempts: {error}", warning=True))
            else:
                d.last_error = error[:1000]
                d.next_attempt_at = now + timedelta(seconds=min(FIRST_RETRY_S * 2 ** (d.attempts - 1), MAX_RETRY_S))
                log.warning("webhook %s: %s (attempt %d; next in %s)", d.url, error, d.attempts,
                            d.next_attempt_at - now)
            d.save(update_fields=["attempts", "delivered_at", "given_up_at", "last_error", "next_attempt_at"])
        record(notes, now)


async def deliver(on_db=database_sync_to_async) -> int:
    """One round: the due deliveries sent at once; `on_db` makes `due` and `settle` coroutines that run on a
    database thread (the caller's choice). Returns how many were attempted."""
    now = timezone.now()
    todo = await on_db(due)(now)
    if not todo:
        return 0
    connector = aiohttp.TCPConnector(resolver=PublicResolver())
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S), connector=connector) as session:
        errors = await asyncio.gather(*(post(session, d) for d in todo))
    await on_db(settle)(list(zip(todo, errors, strict=True)), timezone.now())
    return len(todo)
