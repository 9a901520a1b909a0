from console.scheduler import GpuSlot, ReplicaRequest, plan

GiB = 1024**3


def gpu(id, total_gib, reserved_gib=0, foreign_gib=0):
    return GpuSlot(id=id, host=id.split("/")[0], total_bytes=total_gib * GiB, reserved_bytes=reserved_gib * GiB,
                   foreign_bytes=foreign_gib * GiB)


def test_it_puts_a_replica_on_the_gpu_it_fits_most_tightly():
    result = plan([gpu("a/0", 80), gpu("a/1", 24), gpu("b/0", 40)], [ReplicaRequest("m", 0, 20 * GiB)])
    assert [p.gpu for p in result.placements] == ["a/1"]
    assert "needs 20.00 GiB" in result.placements[0].reason
    assert "4.00 GiB left after" in result.placements[0].reason


def test_it_places_the_largest_replicas_first_so_they_still_fit():
    # Largest first: "big" takes the 40 GiB GPU, then "small" fills exactly the 10 GiB left there.
    requests = [ReplicaRequest("small", 0, 10 * GiB), ReplicaRequest("big", 0, 30 * GiB)]
    result = plan([gpu("h/0", 40), gpu("h/1", 24)], requests)
    assert {p.deployment: p.gpu for p in result.placements} == {"big": "h/0", "small": "h/0"}
    assert not result.unplaced


def test_it_never_overcommits_a_gpu():
    requests = [ReplicaRequest("m", i, 10 * GiB) for i in range(5)]
    result = plan([gpu("h/0", 24), gpu("h/1", 24)], requests)
    per_gpu = {}
    for p in result.placements:
        per_gpu[p.gpu] = per_gpu.get(p.gpu, 0) + 10
    assert per_gpu == {"h/0": 20, "h/1": 20}
    assert len(result.unplaced) == 1


def test_it_counts_reservations_foreign_memory_and_the_buffer():
    result = plan([gpu("h/0", 24, reserved_gib=10, foreign_gib=4)], [ReplicaRequest("m", 0, 9 * GiB)],
                  buffer_bytes=2 * GiB)
    assert not result.placements
    assert result.unplaced[0].reason == "needs 9.00 GiB; the largest free space is 8.00 GiB on h/0"


def test_it_explains_a_model_too_big_for_every_gpu():
    result = plan([gpu("h/0", 24), gpu("h/1", 48)], [ReplicaRequest("huge", 0, 100 * GiB)])
    assert result.unplaced[0].reason == "needs 100.00 GiB; the largest free space is 48.00 GiB on h/1"


def test_it_says_when_there_are_no_gpus_at_all():
    result = plan([], [ReplicaRequest("m", 0, GiB)])
    assert "no GPU is available" in result.unplaced[0].reason
