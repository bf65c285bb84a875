"""The in-drive prefix index: 128-bit block keys -> block locations, in numpy arrays that the
Numba kernels below work on.

Layout:
- `slots` uint64[T, 4], T a power of two >= 2 * capacity: (key lo, key hi, location,
  entry + 1), 0 in the last word for an empty slot.  Open addressing, linear probing, and
  backward-shift deletion (no tombstones).  A probe touches one 32-byte slot, so a lookup
  costs one cache line.
- per entry (capacity of them): `ent` uint64[C, 4] = key lo/hi and location again (for
  eviction) and a chain-successor hint + 1; a pin count (-1 for a free entry); prev/next links
  of a doubly linked LRU list that holds exactly the unpinned entries, least recently used
  at the head.
- Chain hints: insert_chain records, for each key, the entry of the key inserted after it.
  match_prefix checks that entry first (a compare of 16 bytes, no hash probe) and probes the
  table only when the hint is stale or absent.  A chain inserted together sits in consecutive
  entries, so matching it reads memory in order instead of one random cache line per key.
- `state` int64[8]: LRU head, LRU tail, entries, free-stack top, evictions, refusals.

A pinned entry (in use by an in-flight command) is off the LRU list, so eviction never
finds it; unpinning to zero puts it back as most recently used.  With nothing pinned,
eviction is exactly LRU by block count.  When full, an insert evicts the LRU entry, or
reports FULL when the index was made with evict=False or every entry is pinned.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ssdemu_wire.codes import keys_array  # noqa: F401  (the wire format's)

# insert results
INSERTED = 0
EXISTED = 1  # the key was there: touched, location unchanged
FULL = 2  # nothing evictable (or eviction off): not inserted
INSERTED_EVICTED = 3  # inserted after evicting the LRU entry (reported in `evicted`)
# delete / pin / unpin results
OK = 0
MISSING = -1
PINNED = -2  # delete refused: the entry is pinned
NOT_PINNED = -3  # unpin of an entry whose pin count is 0

_HEAD, _TAIL, _COUNT, _FREE_TOP, _EVICTIONS, _REFUSALS = range(6)
_EMPTY = np.uint64(0)


@njit(cache=True, nogil=True, inline="always")
def _home(lo, hi, mask):
    """Slot of a key: the keys are usually hashes already, but any 16 bytes are allowed, so
    mix (splitmix64 finaliser)."""
    h = lo ^ (hi * np.uint64(0x9E3779B97F4A7C15))
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return np.int64(h & mask)


@njit(cache=True, nogil=True)
def find_slot(slots, lo, hi):
    """Slot index holding the key, or -1."""
    mask = np.uint64(slots.shape[0] - 1)
    s = _home(lo, hi, mask)
    while True:
        if slots[s, 3] == _EMPTY:
            return -1
        if slots[s, 0] == lo and slots[s, 1] == hi:
            return s
        s = (s + 1) & np.int64(mask)


@njit(cache=True, nogil=True)
def _lru_unlink(prev, nxt, state, e):
    p = prev[e]
    n = nxt[e]
    if p >= 0:
        nxt[p] = n
    else:
        state[_HEAD] = n
    if n >= 0:
        prev[n] = p
    else:
        state[_TAIL] = p
    prev[e] = -1
    nxt[e] = -1


@njit(cache=True, nogil=True)
def _lru_push_mru(prev, nxt, state, e):
    t = state[_TAIL]
    prev[e] = t
    nxt[e] = -1
    if t >= 0:
        nxt[t] = e
    else:
        state[_HEAD] = e
    state[_TAIL] = e


@njit(cache=True, nogil=True)
def _touch(pin, prev, nxt, state, e):
    if pin[e] == 0:
        _lru_unlink(prev, nxt, state, e)
        _lru_push_mru(prev, nxt, state, e)


@njit(cache=True, nogil=True)
def _remove_slot(slots, s):
    """Empty slot s and shift later members of its probe run back (no tombstones)."""
    mask = slots.shape[0] - 1
    i = s
    j = s
    while True:
        j = (j + 1) & mask
        if slots[j, 3] == _EMPTY:
            break
        k = _home(slots[j, 0], slots[j, 1], np.uint64(mask))
        # move j back to i unless its home lies cyclically in (i, j]
        if (i <= j and (k <= i or k > j)) or (i > j and (k <= i and k > j)):
            for w in range(4):
                slots[i, w] = slots[j, w]
            i = j
    for w in range(4):
        slots[i, w] = _EMPTY


@njit(cache=True, nogil=True)
def _free_entry(pin, prev, nxt, free, state, e):
    pin[e] = -1  # free: a stale chain hint to it no longer matches
    prev[e] = -1
    nxt[e] = -1
    free[state[_FREE_TOP]] = e
    state[_FREE_TOP] += 1
    state[_COUNT] -= 1


@njit(cache=True, nogil=True)
def _insert(slots, ent, pin, prev, nxt, free, state, lo, hi, loc, evict, evicted):
    """Insert key -> loc; returns (result, entry or -1).  evicted: uint64[3] gets (lo, hi,
    loc) of an evicted entry."""
    s = find_slot(slots, lo, hi)
    if s >= 0:
        e = np.int64(slots[s, 3]) - 1
        _touch(pin, prev, nxt, state, e)
        return EXISTED, e
    result = INSERTED
    if state[_FREE_TOP] == 0:
        victim = state[_HEAD]
        if not evict or victim < 0:
            state[_REFUSALS] += 1
            return FULL, -1
        evicted[0] = ent[victim, 0]
        evicted[1] = ent[victim, 1]
        evicted[2] = ent[victim, 2]
        _lru_unlink(prev, nxt, state, victim)
        _remove_slot(slots, find_slot(slots, ent[victim, 0], ent[victim, 1]))
        _free_entry(pin, prev, nxt, free, state, victim)
        state[_EVICTIONS] += 1
        result = INSERTED_EVICTED
    state[_FREE_TOP] -= 1
    e = free[state[_FREE_TOP]]
    ent[e, 0] = lo
    ent[e, 1] = hi
    ent[e, 2] = loc
    ent[e, 3] = 0
    pin[e] = 0
    _lru_push_mru(prev, nxt, state, e)
    state[_COUNT] += 1
    mask = np.uint64(slots.shape[0] - 1)
    s = _home(lo, hi, mask)
    while slots[s, 3] != _EMPTY:
        s = (s + 1) & np.int64(mask)
    slots[s, 0] = lo
    slots[s, 1] = hi
    slots[s, 2] = loc
    slots[s, 3] = np.uint64(e + 1)
    return result, e


@njit(cache=True, nogil=True)
def insert(slots, ent, pin, prev, nxt, free, state, lo, hi, loc, evict, evicted):
    """Insert key -> loc (see _insert); returns the result code."""
    return _insert(slots, ent, pin, prev, nxt, free, state, lo, hi, loc, evict, evicted)[0]


@njit(cache=True, nogil=True)
def delete(slots, ent, pin, prev, nxt, free, state, lo, hi):
    s = find_slot(slots, lo, hi)
    if s < 0:
        return MISSING
    e = np.int64(slots[s, 3]) - 1
    if pin[e] > 0:
        return PINNED
    _lru_unlink(prev, nxt, state, e)
    _remove_slot(slots, s)
    _free_entry(pin, prev, nxt, free, state, e)
    return OK


@njit(cache=True, nogil=True)
def pin_key(slots, pin, prev, nxt, state, lo, hi, delta):
    """delta +1 pins, -1 unpins.  Returns the new pin count or MISSING / NOT_PINNED."""
    s = find_slot(slots, lo, hi)
    if s < 0:
        return MISSING
    e = np.int64(slots[s, 3]) - 1
    if delta > 0:
        if pin[e] == 0:
            _lru_unlink(prev, nxt, state, e)
        pin[e] += 1
    else:
        if pin[e] == 0:
            return NOT_PINNED
        pin[e] -= 1
        if pin[e] == 0:
            _lru_push_mru(prev, nxt, state, e)
    return pin[e]


@njit(cache=True, nogil=True)
def match_prefix(slots, ent, pin, prev, nxt, state, keys, locs, touch):
    """Longest run of leading keys (keys: uint64[n, 2]) present; their locations into locs.
    With touch, the hits become most recently used, in chain order."""
    mask = np.uint64(slots.shape[0] - 1)
    hits = 0
    e_prev = -1
    for i in range(keys.shape[0]):
        lo = keys[i, 0]
        hi = keys[i, 1]
        e = -1
        if e_prev >= 0:  # the chain hint: the entry inserted after the previous hit
            c = np.int64(ent[e_prev, 3]) - 1
            if c >= 0 and pin[c] >= 0 and ent[c, 0] == lo and ent[c, 1] == hi:
                e = c
        if e < 0:
            s = _home(lo, hi, mask)
            while slots[s, 3] != _EMPTY:
                if slots[s, 0] == lo and slots[s, 1] == hi:
                    e = np.int64(slots[s, 3]) - 1
                    break
                s = (s + 1) & np.int64(mask)
            if e < 0:
                break
        locs[i] = ent[e, 2]
        if touch:
            _touch(pin, prev, nxt, state, e)
        hits += 1
        e_prev = e
    return hits


@njit(cache=True, nogil=True)
def insert_chain(slots, ent, pin, prev, nxt, free, state, keys, locs, evict, results,
                 evicted):
    """insert() for each key in order (most recent last), recording each key's entry as the
    chain hint of the key before it; evicted: uint64[n, 3]."""
    e_prev = -1
    for i in range(keys.shape[0]):
        r, e = _insert(slots, ent, pin, prev, nxt, free, state, keys[i, 0], keys[i, 1],
                       locs[i], evict, evicted[i])
        results[i] = r
        if e_prev >= 0 and e >= 0 and pin[e_prev] >= 0:
            ent[e_prev, 3] = np.uint64(e + 1)
        e_prev = e


# ---- the Python face: validation, key conversion, results as exceptions -------------------


class IndexFullError(Exception):
    """No entry could be made: eviction is off, or every entry is pinned."""


class PinnedError(Exception):
    """The entry is pinned by an in-flight command."""


def key_bytes(lo: int, hi: int) -> bytes:
    return int(lo).to_bytes(8, "little") + int(hi).to_bytes(8, "little")


class PrefixIndex:
    """A fixed-capacity index of 16-byte block keys to 64-bit locations, LRU over unpinned
    entries.  evict=False makes a full index refuse inserts instead of evicting."""

    def __init__(self, capacity: int, evict: bool = True):
        if capacity <= 0:
            raise ValueError(f"index capacity must be positive, got {capacity}")
        self.capacity = int(capacity)
        self.evict = bool(evict)
        table = 1 << max(1, (2 * self.capacity - 1).bit_length())
        self.slots = np.zeros((table, 4), np.uint64)
        self.ent = np.zeros((self.capacity, 4), np.uint64)
        self.pin = np.full(self.capacity, -1, np.int32)
        self.prev = np.full(self.capacity, -1, np.int64)
        self.nxt = np.full(self.capacity, -1, np.int64)
        self.free = np.arange(self.capacity - 1, -1, -1, dtype=np.int64)
        self.state = np.zeros(8, np.int64)
        self.state[_HEAD] = self.state[_TAIL] = -1
        self.state[_FREE_TOP] = self.capacity
        self._evicted = np.zeros(3, np.uint64)

    def _arrays(self):
        return self.slots, self.ent, self.pin, self.prev, self.nxt, self.free, self.state

    def __len__(self) -> int:
        return int(self.state[_COUNT])

    @property
    def stats(self) -> dict:
        return {"entries": len(self), "capacity": self.capacity,
                "evictions": int(self.state[_EVICTIONS]), "refusals": int(self.state[_REFUSALS])}

    def insert(self, key: bytes, loc: int) -> tuple[int, tuple[bytes, int] | None]:
        """Returns (INSERTED | EXISTED | INSERTED_EVICTED, (evicted key, its location) or None);
        raises IndexFullError when nothing can be evicted."""
        (lo, hi), = keys_array(key)
        r = insert(*self._arrays(), lo, hi, np.uint64(loc), self.evict, self._evicted)
        if r == FULL:
            raise IndexFullError(f"prefix index full ({self.capacity} entries"
                                 + (", all pinned)" if self.evict else ", eviction off)"))
        ev = None
        if r == INSERTED_EVICTED:
            ev = (key_bytes(self._evicted[0], self._evicted[1]), int(self._evicted[2]))
        return int(r), ev

    def insert_chain(self, keys, locs) -> tuple[np.ndarray, list[tuple[bytes, int]]]:
        """Insert or touch every key in order (most recent last).  Returns the per-key results
        and the (key, location) of everything evicted; a FULL result leaves that key out."""
        k = keys_array(keys)
        locs = np.ascontiguousarray(locs, dtype=np.uint64)
        if locs.shape != (k.shape[0],):
            raise ValueError(f"{k.shape[0]} keys but {locs.size} locations")
        results = np.empty(k.shape[0], np.int64)
        evicted = np.zeros((k.shape[0], 3), np.uint64)
        insert_chain(*self._arrays(), k, locs, self.evict, results, evicted)
        ev = [(key_bytes(e[0], e[1]), int(e[2]))
              for e, r in zip(evicted, results, strict=True) if r == INSERTED_EVICTED]
        return results, ev

    def lookup(self, key: bytes) -> int | None:
        (lo, hi), = keys_array(key)
        s = find_slot(self.slots, lo, hi)
        return None if s < 0 else int(self.slots[s, 2])

    def delete(self, key: bytes) -> None:
        (lo, hi), = keys_array(key)
        r = delete(*self._arrays(), lo, hi)
        if r == MISSING:
            raise KeyError(key)
        if r == PINNED:
            raise PinnedError(f"key {key.hex()} is pinned")

    def match(self, keys, touch: bool = False) -> tuple[int, np.ndarray]:
        """Longest present prefix of a chain: (hit count, locations of the hits)."""
        k = keys_array(keys)
        locs = np.zeros(k.shape[0], np.uint64)
        hits = match_prefix(self.slots, self.ent, self.pin, self.prev, self.nxt, self.state, k,
                            locs, touch)
        return int(hits), locs[:hits]

    def _pin(self, key: bytes, delta: int) -> int:
        (lo, hi), = keys_array(key)
        r = pin_key(self.slots, self.pin, self.prev, self.nxt, self.state, lo, hi, delta)
        if r == MISSING:
            raise KeyError(key)
        if r == NOT_PINNED:
            raise ValueError(f"key {key.hex()} is not pinned")
        return int(r)

    def pin_count(self, key: bytes) -> int:
        """How many pins the key holds (0 for an unpinned or absent key)."""
        (lo, hi), = keys_array(key)
        s = find_slot(self.slots, lo, hi)
        return 0 if s < 0 else max(0, int(self.pin[int(self.slots[s, 3]) - 1]))

    def pin_block(self, key: bytes) -> int:
        return self._pin(key, 1)

    def unpin_block(self, key: bytes) -> int:
        return self._pin(key, -1)

    def lru_keys(self) -> list[bytes]:
        """Unpinned keys from least to most recently used."""
        out = []
        e = int(self.state[_HEAD])
        while e >= 0:
            out.append(key_bytes(self.ent[e, 0], self.ent[e, 1]))
            e = int(self.nxt[e])
        return out
