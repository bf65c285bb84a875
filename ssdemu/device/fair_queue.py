"""The retrieval workers' queue: fair between uids, and between a uid's clients.

Commands wait in a FIFO per client; workers take the next uid in turn that has one waiting,
and within it the next client in turn.  While more than one uid has work (waiting or being
served), no uid holds more than workers - 1 of the workers: a uid whose commands are long
cannot make another's wait for all of them to end (the data plane bounds in-flight commands
per uid the same way).  Within a uid, the same between its clients: while more than one has
work, none holds more than workers - 1.  Pure logic with a condition variable: tested alone."""

from __future__ import annotations

import collections
import threading


class FairQueue:
    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.workers = workers
        self._cv = threading.Condition()
        self._flows: dict[int, collections.OrderedDict] = {}  # uid -> cid -> deque
        self._turn: collections.deque = collections.deque()  # uids with waiting commands
        self._serving: collections.Counter = collections.Counter()  # uid -> in service
        self._client_serving: collections.Counter = collections.Counter()  # (uid, cid) -> ...
        self._closed = False

    def put(self, uid: int, cid: int, item) -> None:
        with self._cv:
            if self._closed:
                raise RuntimeError("the queue is closed")
            clients = self._flows.setdefault(uid, collections.OrderedDict())
            if not clients:
                self._turn.append(uid)
            clients.setdefault(cid, collections.deque()).append(item)
            self._cv.notify()

    def put_take(self, uid: int, cid: int, item):
        """put() then get_nowait(), under one hold of the lock (a worker joins the command it
        popped and takes the next due, most often that one): what the two give."""
        with self._cv:
            self.put(uid, cid, item)  # the condition's lock is reentrant
            return self._take()

    def _cap(self, active) -> int:
        return self.workers - 1 if len(active) > 1 and self.workers > 1 else self.workers

    def _client(self, uid: int):
        """The uid's next client in turn that is under its cap, or None."""
        clients = self._flows[uid]
        active = set(clients) | {c for (u, c), n in self._client_serving.items()
                                 if u == uid and n}
        cap = self._cap(active)
        for cid in clients:
            if self._client_serving[(uid, cid)] < cap:
                return cid
        return None

    def _take(self):
        cap = self._cap(set(self._turn) | {u for u, n in self._serving.items() if n})
        for _ in range(len(self._turn)):
            uid = self._turn[0]
            self._turn.rotate(-1)
            if self._serving[uid] >= cap:
                continue
            cid = self._client(uid)
            if cid is None:
                continue
            clients = self._flows[uid]
            fifo = clients[cid]
            item = fifo.popleft()
            clients.move_to_end(cid)  # its next command after the uid's other clients'
            if not fifo:
                del clients[cid]
            if not clients:
                del self._flows[uid]
                self._turn.remove(uid)
            self._serving[uid] += 1
            self._client_serving[(uid, cid)] += 1
            return (uid, cid), item
        return None

    def get(self):
        """(flow, item) of the next command to serve (call done(flow) after it; flow is
        (uid, client)), or None once the queue is closed."""
        with self._cv:
            while True:
                if self._closed:
                    return None
                got = self._take()
                if got is not None:
                    return got
                self._cv.wait()

    def get_nowait(self):
        """get() without waiting: (flow, item) of a command that may be served now, or None
        (none waiting under its caps; the worker serving the capped ones takes them next)."""
        with self._cv:
            return None if self._closed else self._take()

    @property
    def closed(self) -> bool:
        return self._closed

    def done(self, flow) -> None:
        uid, _ = flow
        with self._cv:
            self._serving[uid] -= 1
            if not self._serving[uid]:
                del self._serving[uid]
            self._client_serving[flow] -= 1
            if not self._client_serving[flow]:
                del self._client_serving[flow]
            self._cv.notify_all()  # a uid held at its cap may go on

    def waiting(self) -> int:
        with self._cv:
            return sum(len(f) for c in self._flows.values() for f in c.values())

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
