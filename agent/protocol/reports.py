"""Reports that say only what changed. An agent reports every couple of seconds, and on a quiet host nothing
it reads moves: sending every GPU and replica each time makes a thousand hosts cost the console a thousand
comparisons that find nothing. `Reporter` remembers what its link was last told and leaves out what is the
same; every `full_every`-th report (and the first on each link) is whole, so a console that lost something
is resynced within a minute. The real agent and the fleet simulator both report through it."""

from __future__ import annotations

from agent.protocol.messages import DeploymentServing, GpuInfo, HostReport, ReplicaStatus

FULL_REPORT_EVERY = 15


class Reporter:
    """What one link was last told. Call `reset()` when a new link opens."""

    def __init__(self, full_every: int = FULL_REPORT_EVERY) -> None:
        if full_every < 1:
            raise ValueError(f"full_every must be at least 1, got {full_every}")
        self.full_every = full_every
        self._said: dict[tuple[str, int], tuple[object, str]] = {}  # (kind, key) -> (the item told, its JSON)
        self._serving: list[DeploymentServing] | None = None
        self._ram: int | None = None
        self._count = 0

    def reset(self) -> None:
        self._said, self._serving, self._ram, self._count = {}, None, None, 0

    def report(self, gpus: list[GpuInfo], replicas: list[ReplicaStatus], serving: list[DeploymentServing],
               ram_free_bytes: int | None, full: bool = False, gone: list[ReplicaStatus] = ()) -> HostReport:
        """The next report: whole when `full`, on a new link or every full_every-th time; otherwise the GPUs and
        replicas whose reading changed, and `serving` / `ram_free_bytes` as None when they did not change. `gone`:
        the last statuses of replicas no longer in `replicas` (stopped since the last report), told once
        (agent/protocol/outbox.py hands them over)."""
        listed = {s.replica_id for s in replicas}
        replicas = sorted([*replicas, *(s for s in gone if s.replica_id not in listed)], key=lambda s: s.replica_id)
        full = full or self._count % self.full_every == 0
        self._count += 1
        same_serving = not full and serving == self._serving
        same_ram = not full and ram_free_bytes == self._ram and ram_free_bytes is not None
        self._serving, self._ram = serving, ram_free_bytes
        return HostReport(gpus=self._changed("gpu", gpus, full), replicas=self._changed("replica", replicas, full),
                          serving=None if same_serving else serving,
                          ram_free_bytes=None if same_ram else ram_free_bytes)

    def _changed(self, kind: str, items: list, full: bool) -> list:
        out = []
        for item in items:
            key = (kind, item.index if kind == "gpu" else item.replica_id)
            said = self._said.get(key)
            if said is not None and said[0] is item:
                # The very message told last time (they are frozen): unchanged without serializing it again. An
                # agent that keeps its readings until they move (the fleet simulator's thousand do) pays nothing
                # for a quiet report; serializing every reading of every report was 23% of the simulator's
                # sampled CPU at 1,000 hosts (py-spy).
                if full:
                    out.append(item)
                continue
            text = item.model_dump_json()
            if full or said is None or said[1] != text:
                out.append(item)
            self._said[key] = item, text
        return out
