"""`ssdemu torture`: a soak and torture kit, for the daemon and for whoever changes it.

Rounds until the time is up, each of four parts (all real processes, media under a temp dir):

- **crash loop**: a daemon on a file (with power-cut emulation), a client storing and
  deleting versioned values with a flush every few changes (every third version a KV block
  stored quantized, laid out by the firmware: QUANT_SCHEMES, and now and then such a block
  demoted in place by KV_REQUANTIZE: DEMOTE), kill -9 or a power cut (seeded)
  at a random moment, a restart, and a check of every key:
  what a completed flush covered must be there (else `lost`), whatever is there must be a
  version that was written, byte for byte (else `corrupt`; a read error counts as corrupt);
- **fuzzer**: random and mutated SQEs written straight into a ring, while a thread scribbles
  over the SQ entries as the daemon reads them;
- **client kills**: clients that make queue pairs, register buffers, pin keys and keep
  commands in flight, killed -9 at random points;
- **multi-client load**: threads with a queue pair each, every value read back and compared;
  half the puts go in one batch with a NOP (the data plane prefetches a batch's lookups and
  small values' hashes: a batch with one keyed command is its own case).

The fuzzer, the kills and the load run against one long-lived daemon whose descriptors,
mappings, pins and RSS are compared, once its clients are gone, with what it had after the
first round.  Seeded: the same seed gives the same schedule (the machine's timing still
decides where a kill lands).
"""

from __future__ import annotations

import hashlib
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

import hostlib
from ssdemu.tools.daemon_process import DaemonProcess
from ssdemu_wire import _ring
from ssdemu_wire.layout import OPCODES

ffi, lib = _ring.ffi, _ring.lib

KEYS = 48          # keys the crash-loop client churns
FLUSH_EVERY = 8    # changes between its flushes


@dataclass
class Tally:
    runs: int = 0
    operations: int = 0
    acknowledged: int = 0
    lost: int = 0
    corrupt: int = 0
    crashes: int = 0          # daemon deaths the kit did not cause
    kills: int = 0            # daemons it killed -9
    power_cuts: int = 0       # power cuts it injected (serve --power-cut)
    client_kills: int = 0
    fuzzed_sqes: int = 0
    leaked_fds: int = 0
    leaked_mappings: int = 0
    leaked_pins: int = 0
    rss_growth_pct: float = 0.0
    seconds: float = 0.0
    seed: int = 0
    version: int = 0          # the last value version written (never reused)
    quantized: int = 0        # crash-loop stores of KV blocks quantized in the drive
    quantized_checked: int = 0  # such blocks found after a restart and checked
    requantized: int = 0      # crash-loop blocks demoted in place (KV_REQUANTIZE)
    problems: list[str] = field(default_factory=list)


def value_of(key: bytes, version: int) -> bytes:
    """The bytes version `version` of a key holds: its name and version, then bytes drawn
    from both (so that any mix-up or torn value shows)."""
    head = b"%s:%d:" % (key, version)
    n = 64 + (version * 7919 + key[-1] * 104729) % 20000
    body = np.random.default_rng(int.from_bytes(hashlib.blake2b(head, digest_size=8)
                                                .digest(), "little")).bytes(n)
    return head + body


# every third version of a crash-loop key is a KV block stored quantized, laid out by the
# firmware (by head where its kind allows: format version 2) with its page summaries, one
# scheme after another, so that crashes and power cuts land in those stores too
QUANT_EVERY = 3
QUANT_SCHEMES = ("plain", "int8_g64", "int4_g32_sym", "fp8_head", "kivi4_g32_r16")
QUANT_SHAPE = (48, 2, 2, 2, 64)  # tokens, K/V, layers, KV heads, head_dim
QUANT_PAGE = 16


# a block of each scheme is demoted in place to the scheme below it (KV_REQUANTIZE; the 4-bit
# ones to 2-bit): a state (version, DEMOTED) is that version's block requantized
DEMOTE = {"plain": "int8_g64", "int8_g64": "int4_g64", "fp8_head": "int4_g32",
          "int4_g32_sym": "int2_g32", "kivi4_g32_r16": "kivi2_g32_r16"}
DEMOTED = "demoted"


def quantized(state) -> bool:
    """A state whose value is a compressed KV block (stored quantized, or demoted)."""
    return isinstance(state, tuple) or (state is not None and state % QUANT_EVERY == 0)


def demotable(state) -> bool:
    return isinstance(state, int) and quantized(state) and DEMOTE[scheme_of(state)] is not None


def block_of(key: bytes, version: int) -> np.ndarray:
    """The fp16 KV block (as uint16 bits) version `version` of a key stores quantized."""
    seed = int.from_bytes(hashlib.blake2b(b"%s:%d:q" % (key, version), digest_size=8)
                          .digest(), "little")
    x = np.random.default_rng(seed).standard_normal(QUANT_SHAPE).astype(np.float16)
    return x.view(np.uint16)


def scheme_of(version: int) -> str:
    return QUANT_SCHEMES[(version // QUANT_EVERY) % len(QUANT_SCHEMES)]


def compressed_of(key: bytes, state) -> np.ndarray:
    """The compressed block the drive makes of that state (the same firmware, here): the
    version's block quantized, and requantized when demoted."""
    from firmware import quant

    version = state[0] if isinstance(state, tuple) else state
    blob = quant.quantize(block_of(key, version), "fp16", scheme_of(version),
                          summary_page=QUANT_PAGE)
    if isinstance(state, tuple):
        blob = quant.requantize(blob, DEMOTE[scheme_of(version)])
    return blob


def version_in(key: bytes, data: bytes, candidates=()) -> int | None:
    """The version a stored value claims to be, if it is exactly that version's bytes (a
    compressed block names no version: it is one of the candidates', byte for byte, or
    none)."""
    if data[:4] == b"SDKV":
        for v in candidates:
            if v is not None and quantized(v) and data == compressed_of(key, v).tobytes():
                return v
        return None
    try:
        name, ver, _ = data.split(b":", 2)
        v = int(ver)
    except ValueError:
        return None
    return v if name == key and data == value_of(key, v) else None


# -- crash loop ------------------------------------------------------------------------------

def _wait_back(sock: str, d: DaemonProcess, timeout: float = 60) -> None:
    """Until a daemon that cut its own power serves again (it starts over in place)."""
    end = time.monotonic() + timeout
    while d.proc.poll() is None and time.monotonic() < end:
        try:
            hostlib.control_request(sock, {"op": "fault", "action": "list"})
            return
        except hostlib.ConnectError:
            time.sleep(0.05)


def crash_run(t: Tally, rng: random.Random, media: str, sock: str, deadline: float,
              known: dict[bytes, int | None], cut: bool = False) -> None:
    """Churn until a kill -9 (or, cut: a power cut) lands at a random moment, restart,
    check every key.  known: each key's state as last verified (carried from run to run)."""
    log = os.path.join(os.path.dirname(sock), "crash.log")
    extra = ["--timing", "off", "--power-cut"]
    d = DaemonProcess(sock, media=media, extra=extra, log_path=log)
    churn = _Churn(t, dict(known))
    seed = rng.randrange(1 << 32)

    def strike():
        if not cut:
            d.proc.kill()
            return
        try:
            hostlib.control_request(sock, {"op": "fault", "action": "power-cut", "seed": seed})
        except hostlib.ConnectError as e:
            t.problems.append(f"the power cut was refused: {e}")

    killer = threading.Timer(min(rng.uniform(0.2, 1.5), max(0.0, deadline - time.monotonic())),
                             strike)
    killer.start()
    try:
        with hostlib.connect(sock) as dev:
            churn.run(dev, rng)
    except (hostlib.DeviceGoneError, hostlib.ConnectError, OSError):
        pass  # the kill: expected
    finally:
        killer.join()
        d.proc.poll()
        if d.proc.returncode not in ((None,) if cut else (None, -signal.SIGKILL)):
            t.crashes += 1
            t.problems.append(f"the daemon died by itself in a crash run: {d.log_tail(300)}")
        if cut:
            t.power_cuts += 1
            _wait_back(sock, d)
        else:
            d.kill()
            t.kills += 1
    if not cut:
        d = DaemonProcess(sock, media=media, extra=extra, log_path=log)
    try:
        with hostlib.connect(sock) as dev:
            _check_keys(t, dev, churn.durable, churn.written, known)
    finally:
        code, err = d.terminate()
        if code != 0:
            t.crashes += 1
            t.problems.append(f"the restarted daemon exited {code}: {err[-300:]}")
    t.runs += 1


class _Churn:
    """A crash run's writes until the strike: every change acknowledged is counted, and what
    each key may hold afterwards is kept: its state as of the last completed flush
    (durable), and the states it was sent to since (written)."""

    def __init__(self, t: Tally, durable: dict[bytes, int | None]):
        self.t, self.durable = t, durable
        self.written: dict[bytes, set[int | None]] = {}
        self.acked: dict[bytes, int | None] = {}
        self.changes = 0
        self.dev = None

    def change(self, key: bytes, state: int | None) -> None:
        self.written.setdefault(key, set()).add(state)
        self.t.operations += 1
        try:
            if state is None:
                self.dev.kv_delete(key)
            elif isinstance(state, tuple):
                self.dev.kv_requantize(key, DEMOTE[scheme_of(state[0])])
                self.t.requantized += 1
            elif quantized(state):
                self.dev.kv_put_quantized(key, block_of(key, state), "fp16", scheme_of(state),
                                          summary_page=QUANT_PAGE)
                self.t.quantized += 1
            else:
                self.dev.kv_put(key, value_of(key, state))
        except hostlib.KeyNotFoundError:
            pass  # a delete of a key that is not there: a state all the same
        self.acked[key] = state
        self.t.acknowledged += 1
        self.changes += 1

    def flush(self) -> None:
        self.dev.flush()
        self.durable.update(self.acked)
        self.written = {}

    def run(self, dev, rng: random.Random) -> None:
        """Until the device goes (the strike ends it with an exception)."""
        self.dev = dev
        t, acked, change = self.t, self.acked, self.change
        while True:
            key = b"crash-%02d" % rng.randrange(KEYS)
            r = rng.random()
            t.version += 1
            # the sequences around a flush that durability has to hold for (issue 33, item
            # 1): the same bytes put again (acknowledged with no record of its own while the
            # first put's group was open), a delete then a put, a put then a delete;
            # otherwise one change, a flush every few
            if r < 0.1 and isinstance(acked.get(key), int):  # (a demoted block: put as such)
                change(key, acked[key])
                self.flush()
            elif r < 0.15:
                change(key, t.version)
                change(key, t.version)
                self.flush()
            elif r < 0.2:
                change(key, None)
                change(key, t.version)
                self.flush()
            elif r < 0.25:
                change(key, t.version)
                change(key, None)
                self.flush()
            elif r < 0.35 and demotable(acked.get(key)):
                change(key, (acked[key], DEMOTED))  # demoted in place, in the drive
            else:
                change(key, None if r < 0.4 else t.version)
                if self.changes % FLUSH_EVERY == 0:
                    self.flush()


def _check_keys(t: Tally, dev, durable: dict, written: dict, known: dict) -> None:
    """After the restart, every key holds its durable state or one it was sent to since."""
    for key in set(durable) | set(written):
        allowed = written.get(key, set()) | {durable.get(key)}
        try:
            data = dev.kv_get(key)
        except hostlib.KeyNotFoundError:
            data = None
        except hostlib.DeviceError as e:
            t.corrupt += 1
            t.problems.append(f"{key!r} reads as {e.status_name}")
            continue
        got = None if data is None else version_in(key, data, allowed)
        if data is not None and got is None:
            t.corrupt += 1
            t.problems.append(f"{key!r} holds bytes no client wrote")
            continue
        if got is not None and quantized(got):
            t.quantized_checked += 1
            if not _decodes(dev, key, got):
                t.corrupt += 1
                t.problems.append(f"{key!r}: the drive's dequantize of version {got} is wrong")
                continue
        if got not in allowed:
            t.lost += 1
            t.problems.append(f"{key!r}: {got} after a flush that covered "
                              f"{durable.get(key)}")
        known[key] = got


def _decodes(dev, key: bytes, version) -> bool:
    """The drive gives back, dequantized in the host's order, what the firmware's own
    dequantize of that state's block gives."""
    from firmware import quant

    want, _ = quant.dequantize(compressed_of(key, version))
    out = np.empty(QUANT_SHAPE, np.uint16)
    try:
        dev.kv_get_dequantized(key, out)
    except hostlib.DeviceError:
        return False
    return bool(np.array_equal(out, want))


# -- fuzzer ----------------------------------------------------------------------------------

def fuzz(t: Tally, rng: random.Random, sock: str, seconds: float) -> None:
    """Random and mutated SQEs straight into a ring; a thread rewrites SQ entries while the
    daemon fetches them."""
    opcodes = sorted(OPCODES.values())
    np_rng = np.random.default_rng(rng.randrange(1 << 63))
    # an owner of its own (a fresh key): what it breaks is its own
    with hostlib.connect(sock, owner_key=secrets.token_hex(32)) as dev:
        qp = dev.queue_pair(256)
        buf = dev.alloc(1 << 20)
        handle, _ = dev._locate(buf)
        hdr = np.frombuffer(qp.mm, np.uint32, 7)
        sq_off, entries = int(hdr[4]), int(hdr[2])
        stop = threading.Event()

        def scribble():
            sq = np.frombuffer(qp.mm, np.uint8, entries * 64, sq_off)
            r = np.random.default_rng(np_rng.integers(1 << 62))
            while not stop.is_set():
                i = int(r.integers(entries * 64 - 8))
                sq[i:i + 8] = r.integers(0, 256, 8, dtype=np.uint8)

        th = threading.Thread(target=scribble, daemon=True)
        th.start()
        sqes = ffi.new("sde_sqe[]", 64)
        raw = np.frombuffer(ffi.buffer(sqes), np.uint8)
        cqes = ffi.new("sde_cqe[]", entries)
        kicked = ffi.new("int *")
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                raw[:] = np_rng.integers(0, 256, raw.size, dtype=np.uint8)
                for i in range(64):
                    if np_rng.random() < 0.7:  # mutated: a real opcode and a real buffer
                        sqes[i].opcode = opcodes[int(np_rng.integers(len(opcodes)))]
                        sqes[i].flags = 0 if np_rng.random() < 0.8 else sqes[i].flags
                        sqes[i].buf = handle if np_rng.random() < 0.7 else sqes[i].buf
                        sqes[i].nsid = int(np_rng.integers(0, 4))
                        sqes[i].length = int(np_rng.integers(0, 1 << 21)) & ~0x1ff
                        sqes[i].buf_offset = int(np_rng.integers(0, 1 << 21)) & ~0xfff
                        sqes[i].param1 = int(np_rng.integers(0, 20))
                n = lib.sde_sq_submit(qp.mem, sqes, 64, qp.doorbell_fd, kicked)
                if n < 0:
                    raise hostlib.DeviceGoneError("the fuzzed queue died")
                t.fuzzed_sqes += n
                lib.sde_cq_wait(qp.mem, qp.completion_fd, qp.hangup_fd, qp.kick_fd, 0, 2_000_000)
                lib.sde_cq_reap(qp.mem, cqes, entries)
        finally:
            stop.set()
            th.join()


# -- client kills ----------------------------------------------------------------------------

_VICTIM = r"""
import sys, numpy as np, hostlib
dev = hostlib.connect(sys.argv[1])
qps = [dev.queue_pair(64) for _ in range(2)]
bufs = [dev.alloc(1 << 16) for _ in range(4)]
for i in range(8):
    k = (b"victim-pin-%02d" % i).ljust(16, b".")  # pins are for 16-byte block keys
    dev.kv_put(k, b"v")
    dev.pin(k)
print("ready", flush=True)
i = 0
while True:
    qp = qps[i % 2]
    fs = [dev.kv_put_async(b"victim-%03d" % (j % 200), bufs[j % 4], qp=qp) for j in range(32)]
    for f in fs:
        f.result()
    i += 1
"""


def kill_clients(t: Tally, rng: random.Random, sock: str, n: int) -> None:
    for _ in range(n):
        p = subprocess.Popen([sys.executable, "-c", _VICTIM, sock], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
        try:
            if p.stdout.readline().strip() != "ready":
                t.problems.append("a victim client could not start")
                continue
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            p.kill()
            p.wait()
            p.stdout.close()
        t.client_kills += 1


# -- multi-client load -----------------------------------------------------------------------

def load(t: Tally, rng: random.Random, sock: str, seconds: float, threads: int = 4) -> None:
    lock = threading.Lock()
    seeds = [rng.randrange(1 << 30) for _ in range(threads)]
    owner = secrets.token_hex(32)  # the workers are one owner

    def worker(w: int) -> None:
        r = random.Random(seeds[w])
        ops = corrupt = 0
        problems: list[str] = []
        with hostlib.connect(sock, owner_key=owner) as dev:
            qp = dev.queue_pair(64)
            out = dev.alloc(1 << 16)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                key = b"load-%d-%03d" % (w, r.randrange(100))
                v = r.randrange(1 << 20)
                if r.random() < 0.5:
                    dev.kv_put(key, value_of(key, v), qp=qp)
                    ops += 1
                else:  # the put fetched in one batch with a command that names no key
                    with dev.batch(qp):
                        fs = [dev.kv_put_async(key, value_of(key, v), qp=qp),
                              dev.submit(OPCODES["NOP"], "nop", qp=qp)]
                    for f in fs:
                        f.result()
                    ops += 2
                ops += 1
                try:
                    n = dev.kv_get(key, out, qp=qp)
                except hostlib.DeviceError as e:  # a read error counts as corrupt
                    corrupt += 1
                    problems.append(f"{key!r} reads as {e.status_name}")
                    continue
                if version_in(key, bytes(out[:n])) != v:
                    corrupt += 1
        with lock:
            t.operations += ops
            t.acknowledged += ops
            t.corrupt += corrupt
            t.problems.extend(problems[:5])

    ths = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()


# -- the daemon's resources ------------------------------------------------------------------

def resources(d: DaemonProcess, sock: str) -> dict:
    """Descriptors, mappings, pins and RSS of a daemon with no client of the kit attached
    (waits for departed clients' resources to be released)."""
    with hostlib.connect(sock) as dev:
        pins = dev.log()["pins"]
    with open(f"/proc/{d.pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
    return {"fds": d.open_fds(), "maps": d.mappings("memfd:"), "pins": pins, "rss_kb": rss}


def settle(d: DaemonProcess, sock: str, want: dict, timeout: float = 10.0) -> dict:
    """Resources once they stop falling toward `want` (dead clients take a moment)."""
    end = time.monotonic() + timeout
    while True:
        now = resources(d, sock)
        if (now["fds"] <= want["fds"] and now["maps"] <= want["maps"]
                and now["pins"] <= want["pins"]) or time.monotonic() > end:
            return now
        time.sleep(0.1)


def torture(seconds: float, seed: int = 0, workdir: str | None = None,
            progress=None) -> Tally:
    t = Tally(seed=seed)
    rng = random.Random(seed)
    start = time.monotonic()
    deadline = start + seconds
    where = tempfile.mkdtemp(prefix="ssdemu-torture-", dir=workdir)
    crash_media = f"file:{os.path.join(where, 'crash.img')}:64M"
    long_sock = os.path.join(where, "long.sock")
    long_log = os.path.join(where, "long.log")

    def long_daemon() -> DaemonProcess:
        return DaemonProcess(long_sock, media="mem:128M", extra=["--timing", "off"],
                             log_path=long_log)

    long_d = long_daemon()
    baseline = None
    known: dict[bytes, int | None] = {}
    try:
        while time.monotonic() < deadline:
            crash_run(t, rng, crash_media, os.path.join(where, "crash.sock"), deadline, known,
                      cut=rng.random() < 0.5)
            if long_d.proc.poll() is not None:
                t.crashes += 1
                t.problems.append(f"the long-lived daemon died: {long_d.log_tail(300)}")
                long_d = long_daemon()
                baseline = None
            try:
                fuzz(t, rng, long_sock, 1.0)
                kill_clients(t, rng, long_sock, 2)
                load(t, rng, long_sock, 1.0)
            except (hostlib.DeviceGoneError, hostlib.ConnectError) as e:
                if long_d.proc.poll() is not None:
                    continue  # counted as a crash at the top of the next round
                t.problems.append(f"long-lived daemon: {e}")
            if baseline is None:
                baseline = settle(long_d, long_sock, {"fds": 0, "maps": 0, "pins": 0}, 2)
            if progress:
                progress(t, time.monotonic() - start)
        if baseline is not None and long_d.proc.poll() is None:
            end = settle(long_d, long_sock, baseline)
            t.leaked_fds = max(0, end["fds"] - baseline["fds"])
            t.leaked_mappings = max(0, end["maps"] - baseline["maps"])
            t.leaked_pins = max(0, end["pins"] - baseline["pins"])
            t.rss_growth_pct = round(100 * (end["rss_kb"] - baseline["rss_kb"])
                                     / baseline["rss_kb"], 2)
    finally:
        if long_d.proc.poll() is None:
            code, err = long_d.terminate()
            if code != 0:
                t.crashes += 1
                t.problems.append(f"the long-lived daemon exited {code}: {err[-300:]}")
        else:
            long_d.kill()
        shutil.rmtree(where, ignore_errors=True)
    t.seconds = round(time.monotonic() - start, 1)
    return t


def summary(t: Tally) -> str:
    return (f"torture {t.seconds:.0f} s seed {t.seed}: {t.runs} crash runs ({t.kills} kills, "
            f"{t.power_cuts} power cuts; {t.quantized} KV blocks stored quantized, "
            f"{t.requantized} demoted in place, {t.quantized_checked} checked after "
            f"restarts), "
            f"{t.operations} operations, {t.acknowledged} acknowledged, {t.lost} lost, "
            f"{t.corrupt} corrupt, {t.crashes} crashes, {t.fuzzed_sqes} fuzzed SQEs, "
            f"{t.client_kills} client kills; leaked fds {t.leaked_fds}, mappings "
            f"{t.leaked_mappings}, pins {t.leaked_pins}; RSS growth {t.rss_growth_pct}%")


def as_dict(t: Tally) -> dict:
    out = asdict(t)
    out.pop("version")
    out["problems"] = out["problems"][:20]
    return out
