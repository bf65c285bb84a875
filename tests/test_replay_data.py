"""Data mode: real KV bytes through a real daemon, held to model mode on the same requests.

The tolerance (docs/replay.md): identical hit accounting (ratios, per tier,
evictions, tokens saved, bytes over the link and on NAND); modelled TTFT and drive load
percentiles within 2% (the drive's store places blocks at other media offsets than model
mode's slots, so their NAND stages land on other planes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import hostlib
from ssdemu.cli import _print_replay
from ssdemu.replay.data_mode import DataModeError, drive_capacity, replay_data
from ssdemu.replay.model_mode import replay_model
from ssdemu.replay.serving import ModelConfig, model_config, parse_capacities
from ssdemu.sim.profile import load
from ssdemu.tools.daemon_process import DaemonProcess
from traces.mooncake import SAMPLE, TraceReader
from traces.synthetic import generate, write

TINY = model_config("tiny")
PROFILE = load("star2000d")
# star2000d with a 1 MiB value limit: a Llama-3-8B block does not fit
SMALL_VALUES = os.path.join(os.path.dirname(__file__), "data", "small-values.yaml")
TOLERANCE = 0.02


def _caps(text, quant):
    return parse_capacities(text, {"hbm": TINY.block_bytes, "dram": TINY.block_bytes,
                                   "drive": TINY.stored_block_bytes(quant)})


@pytest.fixture
def daemon(tmp_path):
    d = DaemonProcess(str(tmp_path / "sde.sock"), media="mem:1G",
                      extra=["--clock", "virtual"])
    yield d
    assert d.terminate()[0] == 0


# A load's p99 is a single slow load: data mode's store packs values at 512 B, so two values
# can share a 4 KiB unit of the drive's FTL, and the second one's write moves the shared
# unit away from the first value's other units (a read-modify-write, as a drive's FTL
# does): a later load of the first value senses one more row.  Model mode gives every block
# its own units.
LOAD_P99_TOLERANCE = 0.05


def _close(a, b, tolerance=TOLERANCE):
    return abs(a - b) <= tolerance * abs(b) + 1e-9


@pytest.mark.parametrize("quant,capacity", [
    ("int8_g64", "drive=blocks:120"),  # the drive's LRU evicts: kv_delete in data mode
    ("int4_g64", "dram=blocks:20,drive=unbounded"),  # two tiers
    (None, "drive=unbounded"),  # fp16 stored as is
])
def test_data_mode_agrees_with_model_mode(daemon, quant, capacity):
    trace = generate(70, seed=5, share=0.8, prefixes=6, prefix_blocks=6,
                     mean_input_tokens=3000)
    caps = _caps(capacity, quant)
    # the virtual-clock daemon does not model the controller's DRAM (its kernels' bytes would
    # fall among other commands' DMA as this host's threads time them): nor does model mode here
    model = replay_model(trace, PROFILE, TINY, quant, caps, dram=False)
    with hostlib.connect(daemon.socket_path) as dev:
        data = replay_data(dev, trace, PROFILE, TINY, quant, caps)
    for key in ("blocks", "block_hit_ratio", "tier_hit_ratio", "evictions",
                "prefill_tokens_saved", "host_link_bytes", "nand_bytes"):
        assert data[key] == model[key], key
    assert data["block_hit_ratio"] > 0.3  # a trace that really hits
    assert data["data"]["data_errors"] == 0 and data["data"]["match_mismatches"] == 0
    drive_hits = round(data["tier_hit_ratio"]["drive"] * data["blocks"])
    assert data["data"]["blocks_verified"] == drive_hits > 0
    if "drive=blocks:" in capacity:
        assert data["evictions"]["drive"] > 0
    for q in ("p50", "p99", "mean"):
        for side in ("with_drive", "without_drive"):
            assert _close(data["ttft_s"][side][q], model["ttft_s"][side][q]), (side, q)
        assert _close(data["drive_load_ms"][q], model["drive_load_ms"][q],
                      LOAD_P99_TOLERANCE if q == "p99" else TOLERANCE), q
    for k in ("link", "nand_channels", "compute"):
        assert _close(data["drive_utilization"][k], model["drive_utilization"][k]), k


def test_data_mode_figures_do_not_depend_on_when_the_client_waits(tmp_path, monkeypatch):
    """A request is accounted once its reads are back, while the next requests' commands
    go out (model_mode.LOOKAHEAD), and a utilization sample reads the drive's books at a
    COUNTERS command's turn: the report is that of a client that waits for each request's
    reads and for every command before each sample, to the last digit (its series too)."""
    from ssdemu.replay import model_mode
    from ssdemu.replay.data_mode import DataDrive

    trace = generate(120, seed=7, share=0.8, prefixes=6, prefix_blocks=6,
                     mean_input_tokens=3000)
    caps = _caps("drive=blocks:150", "int8_g64")

    def run(name):
        d = DaemonProcess(str(tmp_path / f"{name}.sock"), media="mem:1G",
                          extra=["--clock", "virtual"])
        try:
            with hostlib.connect(d.socket_path) as dev:
                out = replay_data(dev, trace, PROFILE, TINY, "int8_g64", caps)
        finally:
            assert d.terminate()[0] == 0
        for k in ("wall_seconds", "requests_per_s", "blocks_per_s", "host_lag", "host_lag_of"):
            out.pop(k)
        return out

    ahead = run("ahead")
    monkeypatch.setattr(model_mode, "LOOKAHEAD", 0)
    monkeypatch.setattr(DataDrive, "books", DataDrive.counters)  # every command complete
    waiting = run("waiting")
    assert ahead["evictions"]["drive"] > 0 and ahead["data"]["blocks_verified"] > 100
    assert len(ahead["series"]["utilization"]) > 50
    assert ahead["data"]["data_errors"] == 0
    assert ahead == waiting


def test_host_dequantization_in_data_mode_agrees_with_model_mode(daemon):
    """--dequant host: the drive returns each block as stored, this host dequantizes it and
    checks it; the model books a plain read of the compressed bytes and the GPU's time."""
    trace = generate(70, seed=5, share=0.8, prefixes=6, prefix_blocks=6,
                     mean_input_tokens=3000)
    caps = _caps("drive=blocks:120", "int4_g64")
    model = replay_model(trace, PROFILE, TINY, "int4_g64", caps, dequant="host")
    with hostlib.connect(daemon.socket_path) as dev:
        data = replay_data(dev, trace, PROFILE, TINY, "int4_g64", caps, dequant="host")
    for key in ("block_hit_ratio", "evictions", "host_link_bytes", "nand_bytes", "dequant",
                "gpu_dequant_bytes_per_s"):
        assert data[key] == model[key], key
    assert data["dequant"] == "host" and data["data"]["data_errors"] == 0
    assert data["data"]["blocks_verified"] > 0
    for q in ("p50", "p99", "mean"):
        assert _close(data["ttft_s"]["with_drive"][q], model["ttft_s"]["with_drive"][q]), q


@pytest.mark.parametrize("kw", [{"store_when": "computed"}, {"store_queue": 2}])
def test_data_mode_stores_when_computed_and_under_admission_control(daemon, kw):
    """Stores booked at each request's first token, and a bounded store queue, through a
    real daemon (a fresh one each: its clock runs from the trace's start): every block read
    back is right and the drive's own prefix match agrees with the host's mirror of it
    (which blocks are dropped and when they enter follows the modelled times, so the hits
    are held to model mode's within the timing tolerance)."""
    trace = generate(70, seed=5, share=0.8, prefixes=6, prefix_blocks=6,
                     mean_input_tokens=3000, rate_per_s=40.0)
    slow = ModelConfig(**{**TINY.__dict__, "prefill_tokens_per_s": 20_000.0})
    caps = _caps("drive=unbounded", "int8_g64")
    model = replay_model(trace, PROFILE, slow, "int8_g64", caps, **kw)
    with hostlib.connect(daemon.socket_path) as dev:
        data = replay_data(dev, trace, PROFILE, slow, "int8_g64", caps, **kw)
    assert data["data"]["data_errors"] == 0 and data["data"]["match_mismatches"] == 0
    assert data["data"]["blocks_verified"] > 0
    assert abs(data["block_hit_ratio"] - model["block_hit_ratio"]) <= 0.02
    if "store_queue" in kw:
        assert data["stores_dropped"] > 0 and model["stores_dropped"] > 0
    else:  # stored when computed: every hit is on KV that exists, and fewer than at arrival
        assert data["hits_on_uncomputed_kv"] == 0 == model["hits_on_uncomputed_kv"]
        at = replay_model(trace, PROFILE, slow, "int8_g64", caps)
        assert at["hits_on_uncomputed_kv"] > 0
        assert data["block_hit_ratio"] < at["block_hit_ratio"]


def test_a_drive_that_replayed_before_is_refused(daemon):
    """Its virtual clock is past the trace's start: every command would queue behind it."""
    trace = generate(10, seed=1)
    caps = _caps("drive=unbounded", "int8_g64")
    with hostlib.connect(daemon.socket_path) as dev:
        replay_data(dev, trace, PROFILE, TINY, "int8_g64", caps)
        for key in dev.kv_list(max_keys=1 << 16):
            dev.kv_delete(key)
        with pytest.raises(DataModeError, match="virtual clock is at .* past the trace"):
            replay_data(dev, trace, PROFILE, TINY, "int8_g64", caps)


def test_data_mode_on_the_sample_prefix(daemon):
    """The bundled Mooncake trace's first requests: the drive's own prefix matching gives
    model mode's hits."""
    reqs = list(TraceReader(SAMPLE))[:60]
    caps = _caps("drive=unbounded", "int8_g64")
    model = replay_model(reqs, PROFILE, TINY, "int8_g64", caps)
    with hostlib.connect(daemon.socket_path) as dev:
        data = replay_data(dev, reqs, PROFILE, TINY, "int8_g64", caps)
    assert data["block_hit_ratio"] == model["block_hit_ratio"] > 0
    assert data["data"]["data_errors"] == 0
    assert _close(data["ttft_s"]["with_drive"]["p99"], model["ttft_s"]["with_drive"]["p99"])


def test_a_block_changed_on_the_drive_is_caught(daemon):
    """Verification can fail: overwrite a stored block behind the replay's back."""
    from ssdemu.replay.data_mode import DataDrive
    from ssdemu.replay.serving import drive_key

    with hostlib.connect(daemon.socket_path) as dev:
        drive = DataDrive(dev, PROFILE, TINY, "int8_g64")
        drive.store(0, [7, 8])
        other = drive.kv.block(drive._at(9))  # 9's bytes under 8's key
        dev.kv_put_quantized(drive_key(8), other, "fp16", "int8_g64")
        load = drive.load(1000, [7, 8])
        assert drive.verified == 0  # the reads are checked when they are waited for
        assert load.result() >= 1000
        assert drive.verified == 2 and drive.data_errors == 1


def test_a_block_missing_from_the_drive_is_caught(daemon):
    """The drive's prefix match is compared with the host's mirror of the drive when it is
    back (the replay goes on with the mirror's), and a block the mirror says the drive holds
    but it lacks is a wrong block read back: both are counted, and the replay goes on."""
    from ssdemu.replay.data_mode import DataDrive
    from ssdemu.replay.serving import drive_key

    with hostlib.connect(daemon.socket_path) as dev:
        drive = DataDrive(dev, PROFILE, TINY, "int8_g64")
        drive.store(0, [1, 2, 3])
        dev.kv_delete(drive_key(2))  # behind the replay's back
        assert drive.match(1000, [1, 2, 3], 3) == 3
        assert drive.load(1000, [1, 2, 3]).result() >= 1000
        drive.counters()  # every command back: the match compared
        assert drive.match_mismatches == 1
        assert drive.verified == 3 and drive.data_errors == 1


def test_hash_ids_of_any_size_take_one_block_each(daemon):
    """The synthetic sequence is as long as the trace has distinct ids, not as its largest
    id: ids near 2**62 replay like small ones, and every block reads back right."""
    from traces.mooncake import Request

    big = 1 << 62
    reqs = [Request(t * 10, 3 * 512, 1, (big + 3, big + 5 * t, big + 5 * t + 1))
            for t in range(6)]
    caps = _caps("drive=unbounded", "int8_g64")
    with hostlib.connect(daemon.socket_path) as dev:
        data = replay_data(dev, reqs, PROFILE, TINY, "int8_g64", caps)
    model = replay_model(reqs, PROFILE, TINY, "int8_g64", caps)
    assert data["block_hit_ratio"] == model["block_hit_ratio"] > 0  # big + 3 hits
    assert data["data"]["blocks_verified"] > 0 and data["data"]["data_errors"] == 0


def test_data_mode_refuses_what_it_cannot_do(tmp_path, daemon):
    caps = _caps("drive=unbounded", "int8_g64")
    reqs = generate(3, seed=1)
    with hostlib.connect(daemon.socket_path) as dev:
        huge = ModelConfig("huge", 64, 8, 128)  # a 128 MiB block, 64+ MiB at int8
        with pytest.raises(DataModeError, match="value limit"):
            replay_data(dev, reqs, PROFILE, huge, "int8_g64", caps)
        with pytest.raises(DataModeError, match="runs profile 'star2000d'"):
            replay_data(dev, reqs, load("pcie4-tlc"), TINY, "int8_g64", caps)
        with pytest.raises(DataModeError, match="capacity is 0"):
            replay_data(dev, reqs, PROFILE, TINY, "int8_g64", _caps("drive=0", "int8_g64"))
        replay_data(dev, reqs, PROFILE, TINY, "int8_g64", caps)
        with pytest.raises(DataModeError, match="fresh drive"):  # blocks of the last replay
            replay_data(dev, reqs, PROFILE, TINY, "int8_g64", caps)
    real = DaemonProcess(str(tmp_path / "real.sock"), media="mem:64M")
    try:
        with hostlib.connect(real.socket_path) as dev:
            with pytest.raises(DataModeError, match="--clock virtual"):
                replay_data(dev, reqs, PROFILE, TINY, "int8_g64", caps)
    finally:
        assert real.terminate()[0] == 0
    fixed = DaemonProcess(str(tmp_path / "fixed.sock"), media="mem:64M",
                          extra=["--clock", "virtual", "--timing", "fixed"])
    try:
        with hostlib.connect(fixed.socket_path) as dev:
            with pytest.raises(DataModeError, match="--timing detailed"):
                replay_data(dev, reqs, PROFILE, TINY, "int8_g64", caps)
    finally:
        assert fixed.terminate()[0] == 0
    key = tmp_path / "admin.key"
    hostlib.owner_key.new(str(key))
    owned = DaemonProcess(str(tmp_path / "owned.sock"), media="mem:64M",
                          extra=["--clock", "virtual", "--admin-key", str(key)])
    try:  # a client that is no admin: the drive's books are not its to read
        with hostlib.connect(owned.socket_path, owner_key="ab" * 32) as dev:
            with pytest.raises(DataModeError, match="connect as the daemon's admin"):
                replay_data(dev, reqs, PROFILE, TINY, "int8_g64", caps)
    finally:
        assert owned.terminate()[0] == 0


def test_the_drive_tier_is_what_the_drive_has_room_for():
    caps = {"hbm": 0, "dram": 5, "drive": None}
    assert drive_capacity(caps, room=500, most=40) == {"hbm": 0, "dram": 5, "drive": 460}
    assert drive_capacity({**caps, "drive": 460}, 500, 40)["drive"] == 460  # as given
    with pytest.raises(DataModeError, match=r"capacity is 461 blocks.*room for 500.*up to "
                       r"40.*drive=blocks:460 or less"):
        drive_capacity({**caps, "drive": 461}, 500, 40)
    with pytest.raises(DataModeError, match="room for 40 blocks.*bigger media"):
        drive_capacity(caps, room=40, most=40)


def test_data_mode_on_media_smaller_than_the_trace(tmp_path):
    """A drive whose media holds fewer blocks than the trace names: the drive tier (unbounded
    asked) is the drive's room less one request's stores, its LRU evicts through kv_delete,
    and the replay's accounting is model mode's at that capacity.  Before, the drive's store
    failed part way (CAPACITY_EXCEEDED).  A larger capacity asked is refused up front."""
    trace = generate(90, seed=7, share=0.5, prefixes=6, prefix_blocks=6,
                     mean_input_tokens=3000)
    distinct = len({b for r in trace for b in r.hash_ids})
    most = max(len(set(r.hash_ids)) for r in trace)
    d = DaemonProcess(str(tmp_path / "small.sock"), media="mem:64M",
                      extra=["--clock", "virtual"])
    try:
        with hostlib.connect(d.socket_path) as dev:
            with pytest.raises(DataModeError, match="drive=blocks:"):
                replay_data(dev, trace, PROFILE, TINY, "int8_g64",
                            _caps("drive=unbounded", "int8_g64") | {"drive": distinct})
            assert dev.log()["store"]["keys"] == 0  # refused before anything was stored
            data = replay_data(dev, trace, PROFILE, TINY, "int8_g64",
                               _caps("drive=unbounded", "int8_g64"))
    finally:
        assert d.terminate()[0] == 0
    room, tier = data["data"]["drive_room_blocks"], data["capacity_blocks"]["drive"]
    assert tier == room - most and tier < distinct
    assert data["evictions"]["drive"] > 0
    assert data["data"]["data_errors"] == 0 and data["data"]["match_mismatches"] == 0
    model = replay_model(trace, PROFILE, TINY, "int8_g64",
                         _caps(f"drive=blocks:{tier}", "int8_g64"), dram=False)
    for key in ("block_hit_ratio", "tier_hit_ratio", "evictions", "prefill_tokens_saved"):
        assert data[key] == model[key], key


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "ssdemu", "replay", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_cli_data_mode_starts_and_stops_its_daemon_and_plots(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    write(generate(40, seed=2, share=0.8, prefixes=4, prefix_blocks=4,
                   mean_input_tokens=2000), str(trace))
    img = tmp_path / "drive.img"
    p = _cli(str(trace), "--mode", "data", "--model", "tiny", "--media", f"file:{img}:512M",
             "--plot", str(tmp_path / "plots"), "--decode", "drive-select", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    m = json.loads(_cli(str(trace), "--model", "tiny", "--decode", "drive-select",
                        "--json").stdout)
    assert r["mode"] == "data" and r["block_hit_ratio"] == m["block_hit_ratio"] > 0
    assert r["decode"] == m["decode"] and r["decode"]["tpot_s"]["p50"] > 0  # modelled alike
    assert r["data"]["data_errors"] == 0
    # host lag is counted among the daemon's commands and kernel calls, and said so; model
    # mode times in its own process, where nothing lags, and says nothing of it
    assert 0 <= r["host_lag"] <= r["host_lag_of"] and r["host_lag_of"] > r["blocks"]
    assert m["host_lag"] == m["host_lag_of"] == 0
    _print_replay(r)
    said = capsys.readouterr().out
    assert (f"host slower than the modelled drive on {r['host_lag']:,} of "
            f"{r['host_lag_of']:,} commands and kernel calls") in said
    _print_replay(m)
    assert "host slower" not in capsys.readouterr().out
    for name in ("hit_ratio.png", "ttft_cdf.png", "drive_utilization.png"):
        png = (tmp_path / "plots" / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    # the daemon it started is gone: no process holds the file open
    assert not _holders(str(img))


def _holders(path: str) -> list[str]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone, or not ours to see
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                    out.append(pid)
            except OSError:
                pass
    return out


@pytest.mark.parametrize("args,msg", [
    (["--mode", "data", "--model", "tiny"], "needs --socket"),
    (["--mode", "data", "--model", "tiny", "--socket", "/nonexistent/s"], "nonexistent"),
    (["--mode", "data", "--model", "llama-3-8b", "--media", "mem:64M", "--profile",
      str(SMALL_VALUES)], "value limit"),
    (["--requests", "0"], "must be positive"),
    (["--mode", "data", "--model", "tiny", "--media", "mem:64M", "--capacity",
      "drive=blocks:100000"], "give --capacity drive=blocks:"),
])
def test_cli_data_mode_errors_are_one_line(args, msg):
    p = _cli(SAMPLE, *args)
    assert p.returncode in (1, 2) and msg in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
