"""The retrieval workers' queue (ssdemu/device/fair_queue.py): fair between uids and between
a uid's clients, no uid holding every worker while another waits."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ssdemu.device.fair_queue import FairQueue


def _drain(q, n):
    out = []
    for _ in range(n):
        flow, item = q.get()
        out.append(item)
        q.done(flow)
    return out


def test_uids_take_turns_whatever_order_they_queued_in():
    q = FairQueue(1)
    for i in range(3):
        q.put(1, 10, ("a", i))
    for i in range(3):
        q.put(2, 20, ("b", i))
    assert _drain(q, 6) == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]


def test_a_uids_clients_take_turns_too():
    q = FairQueue(1)
    for i in range(2):
        q.put(7, 1, ("c1", i))
    q.put(7, 2, ("c2", 0))
    assert _drain(q, 3) == [("c1", 0), ("c2", 0), ("c1", 1)]


def test_no_uid_holds_every_worker_while_another_waits():
    q = FairQueue(2)
    for i in range(4):
        q.put(1, 1, ("a", i))
    first = q.get()  # uid 1 alone: it may have both workers
    second = q.get()
    assert first[0] == second[0] == (1, 1)
    q.put(2, 2, ("b", 0))
    q.done((1, 1))  # a worker frees: uid 2 waits, so uid 1 may hold one worker, not two
    assert q.get() == ((2, 2), ("b", 0))
    q.put(2, 2, ("b", 1))
    got = []
    t = threading.Thread(target=lambda: got.append(q.get()))
    t.start()
    t.join(0.2)
    assert t.is_alive()  # uid 2 is at its cap (1 of 2 workers), uid 1 too
    q.done((2, 2))
    t.join(5)
    assert got and got[0][0][0] in (1, 2)


def test_no_client_of_a_uid_holds_every_worker_while_another_of_its_clients_waits():
    """The same rule between one uid's clients: its long-running client cannot take both
    workers from its other client's short command."""
    q = FairQueue(2)
    for i in range(3):
        q.put(5, 1, ("long", i))
    assert q.get()[0] == (5, 1)
    assert q.get()[0] == (5, 1)  # alone: both workers
    q.put(5, 2, ("short", 0))
    q.done((5, 1))
    assert q.get() == ((5, 2), ("short", 0))  # not ("long", 2), though it came first
    q.done((5, 2))
    q.done((5, 1))
    assert q.get() == ((5, 1), ("long", 2))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=40))
def test_every_command_is_served_once_and_each_clients_in_order(puts):
    q = FairQueue(1)
    for n, (uid, cid) in enumerate(puts):
        q.put(uid, (uid, cid), n)
    served = _drain(q, len(puts))
    assert sorted(served) == list(range(len(puts)))
    for key in {(u, c) for u, c in puts}:
        mine = [n for n in served if puts[n] == key]
        assert mine == sorted(mine)
    assert q.waiting() == 0


def test_close_wakes_every_worker_and_refuses_more():
    q = FairQueue(3)
    out = []
    ts = [threading.Thread(target=lambda: out.append(q.get())) for _ in range(3)]
    for t in ts:
        t.start()
    q.close()
    for t in ts:
        t.join(5)
    assert out == [None, None, None]
    with pytest.raises(RuntimeError, match="closed"):
        q.put(1, 1, "x")
    with pytest.raises(ValueError, match="at least 1"):
        FairQueue(0)


def test_get_nowait_takes_what_may_be_served_now_and_leaves_the_capped():
    """The workers' loop (ssdemu/device/retrieval.py): a worker that queued a command over
    its uid's cap gets None and goes back to the data plane; the worker serving that uid
    takes it when it is done."""
    q = FairQueue(2)
    assert q.get_nowait() is None  # nothing waiting
    q.put(1, 1, ("a", 0))
    q.put(2, 2, ("b", 0))
    a = q.get_nowait()
    assert a == ((1, 1), ("a", 0))
    q.put(1, 1, ("a", 1))
    assert q.get_nowait() == ((2, 2), ("b", 0))  # uid 2's turn
    assert q.get_nowait() is None  # uid 1 at its cap (1 of 2) while uid 2 is served
    assert q.waiting() == 1
    q.done(a[0])
    assert q.get_nowait() == ((1, 1), ("a", 1))
    q.close()
    assert q.closed and q.get_nowait() is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "done"]), st.integers(0, 2),
                          st.integers(0, 1)), min_size=1, max_size=40))
def test_put_take_is_put_then_get_nowait(ops):
    """The workers' one hold of the lock for a command they popped (Retrieval._next) takes
    what put() then get_nowait() take, whatever is queued or served already."""
    a, b = FairQueue(2), FairQueue(2)
    served_a, served_b = [], []
    for n, (op, uid, cid) in enumerate(ops):
        if op == "done":
            if served_a:
                a.done(served_a.pop(0))
                b.done(served_b.pop(0))
            continue
        got_a = a.put_take(uid, (uid, cid), n)
        b.put(uid, (uid, cid), n)
        got_b = b.get_nowait()
        assert got_a == got_b
        if got_a is not None:
            served_a.append(got_a[0])
            served_b.append(got_b[0])
        assert a.waiting() == b.waiting()
