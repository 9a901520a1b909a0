import asyncio
import signal

from django.conf import settings
from django.core.management.base import BaseCommand

from console.control.loop import scheduler_loop
from console.gctune import tune


class Command(BaseCommand):
    help = ("Take part in the scheduler election and run the scheduler loop while leading (when the console runs "
            "under its own ASGI server). Any number may run: exactly one leads; the others take over when it dies.")

    def handle(self, **options):
        tune()  # a pass at 1,000 hosts makes many objects: see console/gctune.py
        asyncio.run(self._run())

    async def _run(self):
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        self.stdout.write("scheduler loop running; Ctrl-C stops it")
        self.stdout.flush()
        await scheduler_loop(stop, settings.MODELGRID_SCHEDULER_INTERVAL)
