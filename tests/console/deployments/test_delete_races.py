"""Deleting a deployment while a scheduler pass plans it (the probe's DELETE right after POST): the delete always
succeeds, the pass never fails, and no replica row outlives its deployment, whichever of the two commits first.

The interleavings are forced: a hook in one of them runs the other, in a thread on a connection of its own on
PostgreSQL, and goes on once the other finished or waits for a row lock. SQLite takes one writer at a time (and
the console runs every database call there on one thread), so only the same-transaction case can happen there."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections
from django.db.models.signals import pre_delete

from console.catalog import adapters
from console.catalog.models import Adapter
from console.control import reconcile
from console.deployments import policy
from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment, delete_deployment, update_deployment
from tests.adapter_files import write_adapter
from tests.refusals import refusal

pytestmark = pytest.mark.django_db(transaction=True)
on_postgresql = pytest.mark.skipif(connection.vendor != "postgresql",
                                   reason="two writers at once: PostgreSQL only (SQLite has one writer)")
UP = "model.layers.0.mlp.up_proj"  # the conftest model's [32, 16] weight


class Other:
    """`fn` on a thread (its own connection), its outcome kept: what it returned or raised."""

    def __init__(self, fn):
        self.result, self.error, self.done = None, None, threading.Event()
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn):
        try:
            self.result = fn()
        except BaseException as e:  # noqa: BLE001 (the test reports it)
            self.error = e
        finally:
            connections.close_all()
            self.done.set()

    def finished_or_blocked(self, limit_s: float = 20.0) -> None:
        """Return once it finished or waits for a lock this connection's transaction holds."""
        deadline = time.monotonic() + limit_s
        while not self.done.wait(0.02):
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                               "WHERE NOT l.granted AND a.datname = current_database()")
                if cursor.fetchone()[0]:
                    return
            assert time.monotonic() < deadline, "the other transaction neither finished nor waited for a lock"

    def outcome(self):
        assert self.done.wait(30), "the other transaction did not finish"
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture
def chat(host, model):
    return create_deployment("chat", "tiny")


def assert_gone():
    assert not Deployment.objects.exists()
    assert not Replica.objects.exists()
    assert not Replica.gpus.through.objects.exists()


@on_postgresql
def test_a_pass_that_commits_while_the_delete_collects_replicas_does_not_fail_the_delete(api, chat):
    # The probe's 500: the delete read no replicas, a pass committed one, and the deployment's row went with
    # a replica still pointing at it.
    others = []

    def pass_meanwhile(sender, instance, **kwargs):
        if not others:
            others.append(Other(reconcile.reconcile_once))
            others[0].finished_or_blocked()

    pre_delete.connect(pass_meanwhile, sender=Deployment)
    try:
        r = api.delete("/api/v1/deployments/chat")
    finally:
        pre_delete.disconnect(pass_meanwhile, sender=Deployment)
    assert r.status_code == 204, r.content
    others[0].outcome()  # the pass did not fail either
    assert_gone()
    reconcile.reconcile_once()
    assert_gone()


@on_postgresql
def test_a_delete_while_a_pass_writes_waits_for_it_and_takes_its_replicas(chat, monkeypatch):
    # The other order: the pass has written the new replica when the delete comes; the delete waits for the pass
    # and deletes what it wrote.
    real = reconcile.refresh_deployment_states
    others = []

    def delete_meanwhile():
        if not others:
            others.append(Other(lambda: delete_deployment("chat")))
            others[0].finished_or_blocked()
        return real()

    monkeypatch.setattr(reconcile, "refresh_deployment_states", delete_meanwhile)
    reconcile.reconcile_once()
    others[0].outcome()
    assert_gone()


@on_postgresql
def test_a_delete_that_commits_while_a_pass_plans_does_not_fail_the_pass(chat, monkeypatch):
    # Placed and settled first: a pass that changes a new deployment's figures holds its row, and the delete
    # would wait for it (the order above). Scaled up, the next pass only reads the row before it writes a replica.
    reconcile.reconcile_once()
    update_deployment("chat", {"replicas": 2})
    real = reconcile.plan
    others = []

    def delete_meanwhile(request):
        planned = real(request)
        if not others:
            others.append(Other(lambda: delete_deployment("chat")))
            others[0].finished_or_blocked()
        return planned

    monkeypatch.setattr(reconcile, "plan", delete_meanwhile)
    result = reconcile.reconcile_once()
    others[0].outcome()
    assert others[0].done.is_set() and "place" not in result.actions  # nothing written, nor told, for it
    assert_gone()


def test_a_pass_writes_nothing_for_a_deployment_deleted_after_it_read_the_rows(chat, monkeypatch):
    # The same race within one transaction, on every database: rows read, the deployment deleted, the plan
    # written. The foreign keys are checked at commit, so the pass must not write what would fail there.
    real = reconcile.plan

    def delete_meanwhile(request):
        planned = real(request)
        if Deployment.objects.exists():
            delete_deployment("chat")
        return planned

    monkeypatch.setattr(reconcile, "plan", delete_meanwhile)
    reconcile.reconcile_once()
    assert_gone()
    assert not reconcile.reconcile_once().changed


def test_an_adapter_whose_deployment_is_deleted_while_it_is_read_is_refused_in_words(api, chat, tmp_path,
                                                                                     monkeypatch):
    # The deployment was found, then deleted while the adapter's files were read: the registration must not
    # write an adapter (or the pool's new estimate) for a row that is gone.
    path = write_adapter(tmp_path / "sql", {UP: (8, 16, 32)})
    real = adapters.read_adapter_dir

    def delete_meanwhile(*args, **kwargs):
        delete_deployment("chat")
        return real(*args, **kwargs)

    monkeypatch.setattr(adapters, "read_adapter_dir", delete_meanwhile)
    r = api.post("/api/v1/adapters", {"name": "sql", "deployment": "chat", "path": str(path)})
    assert r.status_code == 422, r.content
    assert refusal(r) == "no deployment named 'chat'"
    assert not Adapter.objects.exists()
    assert_gone()


@on_postgresql
def test_a_change_while_the_deployment_is_deleted_is_made_before_the_delete(api, chat, monkeypatch):
    # The change found the row, the delete came while it checked the new policy: the save must not find nothing.
    real = policy.validate_policy
    others = []

    def delete_meanwhile(values):
        if not others:
            others.append(Other(lambda: delete_deployment("chat")))
            others[0].finished_or_blocked()
        return real(values)

    monkeypatch.setattr(policy, "validate_policy", delete_meanwhile)
    r = api.patch("/api/v1/deployments/chat", {"replicas": 2})
    assert r.status_code == 200, r.content
    others[0].outcome()
    assert_gone()
