"""Reports that say only what changed (agent/protocol/reports.py): a reading is listed when its content differs
from what the link was last told, every full_every-th report lists everything, and a reading handed over again as
the very same (frozen) message is known unchanged without serializing it."""

import pytest

from agent.protocol.messages import GpuInfo, ReplicaStatus
from agent.protocol.reports import Reporter


def gpu(index: int, used: int) -> GpuInfo:
    return GpuInfo(index=index, uuid=f"GPU-{index}", name="Simulated GPU", total_bytes=100, used_bytes=used,
                   own_bytes=used, simulated=True)


def ids(report) -> tuple[list[int], list[int]]:
    return [g.index for g in report.gpus], [r.replica_id for r in report.replicas]


@pytest.fixture
def dumps(monkeypatch) -> list[object]:
    """Every GpuInfo and ReplicaStatus serialized, in order."""
    seen = []
    for cls in (GpuInfo, ReplicaStatus):
        original = cls.model_dump_json

        def counting(self, *args, _original=original, **kwargs):
            seen.append(self)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "model_dump_json", counting)
    return seen


def test_only_what_changed_is_listed_and_every_full_every_th_report_lists_everything():
    reporter = Reporter(full_every=3)
    gpus = [gpu(0, 10), gpu(1, 20)]
    replicas = [ReplicaStatus(replica_id=7, state="loading")]
    assert ids(reporter.report(gpus, replicas, [], 5)) == ([0, 1], [7])  # a new link's first: whole
    # New messages with the same content: not listed (an agent that reads its GPUs afresh each time).
    assert ids(reporter.report([gpu(0, 10), gpu(1, 20)], [ReplicaStatus(replica_id=7, state="loading")], [], 5)) \
        == ([], [])
    assert ids(reporter.report([gpu(0, 10), gpu(1, 25)], [ReplicaStatus(replica_id=7, state="ready")], [], 5)) \
        == ([1], [7])
    assert ids(reporter.report([gpu(0, 10), gpu(1, 25)], [], [], 5)) == ([0, 1], [])  # the third: whole


def test_the_same_message_handed_over_again_is_not_serialized_again(dumps):
    reporter = Reporter(full_every=15)
    gpus, replicas = [gpu(0, 10), gpu(1, 20)], [ReplicaStatus(replica_id=7, state="ready")]
    reporter.report(gpus, replicas, [], 5)
    assert len(dumps) == 3
    dumps.clear()
    for _ in range(5):  # a quiet host keeping its readings: nothing listed, nothing serialized
        assert ids(reporter.report(gpus, replicas, [], 5)) == ([], [])
    assert dumps == []
    moved = gpu(1, 30)  # one reading moved: only it is serialized, and listed
    assert ids(reporter.report([gpus[0], moved], replicas, [], 5)) == ([1], [])
    assert dumps == [moved]


def test_a_full_report_lists_the_same_messages_whole():
    reporter = Reporter(full_every=2)
    gpus, replicas = [gpu(0, 10)], [ReplicaStatus(replica_id=7, state="ready")]
    reporter.report(gpus, replicas, [], 5)
    assert ids(reporter.report(gpus, replicas, [], 5)) == ([], [])
    assert ids(reporter.report(gpus, replicas, [], 5)) == ([0], [7])
    assert ids(reporter.report(gpus, replicas, [], 5, full=True)) == ([0], [7])
    reporter.reset()  # a new link
    assert ids(reporter.report(gpus, replicas, [], 5)) == ([0], [7])
