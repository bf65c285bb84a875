"""The `ssdemu` command line.  Each subcommand parses its arguments here and calls one
function elsewhere; every failure ends as one line on stderr and a non-zero exit code."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys

from ssdemu.errors import SsdemuError
from ssdemu.units import parse_size

EXIT_FAILURE = 1
EXIT_USAGE = 2
MIN_BENCH_LOGICAL = 64 << 20  # bench device's smallest FTL logical space


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like every other failure
        self.exit(EXIT_USAGE, f"ssdemu: error: {message}\n")


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive_size(text: str) -> int:
    n = _size_arg(text)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a size above 0, got {text!r}")
    return n


def _metrics_address(text: str) -> str:
    from ssdemu.device.metrics import parse_address

    try:
        parse_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _lba_range(text: str) -> tuple[int, int]:
    first, sep, count = text.partition(":")
    try:
        value = int(first), int(count)
    except ValueError:
        value = None
    if not sep or value is None or value[0] < 0 or value[1] < 1:
        raise argparse.ArgumentTypeError(f"an LBA range is FIRST:COUNT (COUNT >= 1), "
                                         f"got {text!r}")
    return value


def _group_id(text: str) -> int:
    """A group name or gid (argparse type): the gid."""
    import grp

    try:
        return grp.getgrnam(text).gr_gid
    except KeyError:
        pass
    try:
        return grp.getgrgid(int(text)).gr_gid
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"no such group: {text!r}") from None


def _whole_number(zero_ok: bool):
    """An argparse type: a whole number > 0 (or >= 0)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if v < 0 or (v == 0 and not zero_ok):
            raise argparse.ArgumentTypeError(
                f"must be {'>= 0' if zero_ok else 'positive'}: {text!r}")
        return v
    return parse


_positive_int = _whole_number(zero_ok=False)
_nonnegative_int = _whole_number(zero_ok=True)


def _finite_number(zero_ok: bool):
    """An argparse type: a finite number > 0 (or >= 0); float() alone takes 'nan' and
    'inf'."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok):
            raise argparse.ArgumentTypeError(
                f"must be a {'finite number >= 0' if zero_ok else 'positive finite number'}: "
                f"{text!r}")
        return v
    return parse


_positive_float = _finite_number(zero_ok=False)
_finite_float = _finite_number(zero_ok=True)


def _size_list(text: str) -> list[int]:
    """An argparse type: comma-separated whole numbers with K / M suffixes (x 1,024)."""
    out = []
    for part in text.split(","):
        t = part.strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20}.get(t[-1:], 1)
        digits = t[:-1] if mult > 1 else t
        if not digits.isdigit() or int(digits) == 0:
            raise argparse.ArgumentTypeError(f"not a positive count: {part!r}")
        out.append(int(digits) * mult)
    return out


def _threads(text: str) -> int | str:
    if text in ("1", "2", "auto"):
        return text if text == "auto" else int(text)
    raise argparse.ArgumentTypeError(f"expected 1, 2 or auto, got {text!r}")


def _prefill_rate(text: str) -> float | str | None:
    if text == "model":
        return None  # the model config's own rate
    return "auto" if text == "auto" else _positive_float(text)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ssdemu", description="An emulated AI SSD.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = _add_serve(sub)
    _add_serve_limits(serve)
    _add_format(sub)
    _add_ctl(sub)
    _add_tools(sub)
    _add_mounts(sub)
    _add_replay(sub)
    _add_eval(sub)
    _add_bench(sub)
    return p


def _add_serve(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`serve`: the drive, its media, socket and access."""
    serve = sub.add_parser("serve", help="run the emulated drive (the device process)")
    serve.add_argument("--profile", default="star2000d",
                       help="a profile name from ssdemu/sim/profiles/ or a YAML path")
    serve.add_argument("--media", required=True,
                       help="file:PATH[:SIZE], block:/dev/NAME or mem:SIZE")
    serve.add_argument("--socket", required=True, help="the Unix socket clients connect to")
    serve.add_argument("--allow-uid", type=int, action="append", default=[],
                       help="another uid allowed to connect (the daemon's own and root are)")
    serve.add_argument("--group", type=_group_id,
                       help="a group (name or gid) whose members may connect: the socket "
                       "is then 0660 in that group (default: 0600, the daemon's user)")
    serve.add_argument("--poll", action="store_true",
                       help="the data plane polls its queues and never sleeps: one core "
                       "busy all the time, no doorbell or wake-up in a command's path (as "
                       "SPDK's reactors; for a machine with a core to spare, pinned)")
    serve.add_argument("--media-io", choices=("auto", "io_uring"), default="auto",
                       help="auto (default): reads and writes of shared-memory media (mem:, "
                       "a file on tmpfs) run in the data plane's thread, as the kernel's "
                       "worker would run them, one hand-off fewer; other media through "
                       "io_uring.  io_uring: every I/O through io_uring (tmpfs's through "
                       "its worker threads)")
    serve.add_argument("--realtime", action="store_true",
                       help="the data plane thread runs SCHED_RR (priority 1): woken by a "
                       "completion or a doorbell, it runs ahead of CPU-bound neighbours, as "
                       "a drive's interrupt would (needs CAP_SYS_NICE or RLIMIT_RTPRIO)")
    serve.add_argument("--admin-key", metavar="FILE",
                       help="an owner key file (ssdemu owner-key): its holder alone is an "
                       "admin (faults anywhere, power cut, removal, every owner's "
                       "namespaces); without it the daemon's own user and root are")
    # quotas are a uid's, over all its connections and owner keys (ssdemu/device/quotas.py);
    # the -per-client spellings are the old names of the same options
    serve.add_argument("--max-buffers-per-uid", "--max-buffers-per-client",
                       dest="max_buffers", type=_positive_int,
                       help="registered buffers one uid may hold (default 3/4 of the "
                       "device's 1024), so that none can lock the others out")
    serve.add_argument("--max-buffer-bytes-per-uid", dest="max_buffer_bytes",
                       type=_positive_size,
                       help="bytes of registered buffers one uid may hold (default: no "
                       "limit: the pages are the client's, charged to its memory cgroup)")
    serve.add_argument("--max-namespaces-per-uid", dest="max_namespaces", type=_positive_int,
                       help="namespaces one uid may hold, shared ones it created included "
                       "(default 3/4 of the store's 64)")
    serve.add_argument("--max-namespace-bytes-per-uid", dest="max_namespace_bytes",
                       type=_positive_size,
                       help="bytes of namespaces one uid may hold (default 3/4 of the "
                       "store's data region)")
    serve.add_argument("--max-pins-per-uid", dest="max_pins", type=_positive_int,
                       help="keys one uid may hold pinned at once, over all its clients "
                       "(default 65,536)")
    serve.add_argument("--metrics", type=_metrics_address, metavar="HOST:PORT",
                       help="serve Prometheus metrics (the log page's counters) at "
                       "http://HOST:PORT/metrics")
    serve.add_argument("--retrieval-host-bytes", type=_positive_size, metavar="SIZE",
                       help="this host's memory the retrieval workers keep decoded blocks "
                       "and summaries in (default 128M); a sequence larger than it is "
                       "streamed, a part of its blocks at a time")
    serve.add_argument("--power-cut", action="store_true",
                       help="power-cut emulation: keep what each write overwrites until a "
                       "flush makes it durable, so that 'ctl fault power-cut' can lose it "
                       "(costs a read and a copy per write; needs the profile's write cache "
                       "and file or block media)")
    return serve


def _add_serve_limits(serve: argparse.ArgumentParser) -> None:
    """`serve`'s quotas, metrics, power cuts and data-plane options."""
    serve.add_argument("--max-queue-pairs-per-uid", "--max-queue-pairs-per-client",
                       dest="max_queue_pairs", type=_positive_int,
                       help="queue pairs one uid may hold (default: 3/4 of the profile's "
                       "queue.max_queue_pairs)")
    serve.add_argument("--max-inflight-per-uid", "--max-inflight-per-client",
                       dest="max_inflight", type=_positive_int,
                       help="commands one uid may have in flight over all its queue pairs; "
                       "past it the rest wait in its queues (default: 3/4 of the profile's "
                       "queue.io_depth, so others always have a share)")
    serve.add_argument("--timing", choices=("detailed", "fixed", "off"), default="detailed",
                       help="hold completions until the profile's modelled time (detailed, "
                       "the default; fixed: every command its unloaded latency), or post "
                       "them when the media is done (off)")
    serve.add_argument("--clock", choices=("real", "virtual"), default="real",
                       help="virtual: SQEs carry submission times, CQEs completion times")
    serve.add_argument("--format", action="store_true",
                       help="format the media even if it holds something else")
    serve.add_argument("--kv-layout", choices=("head", "token"), default="head",
                       help="how the firmware lays out a stored KV block: by head (the "
                       "default: one layer's page of one KV head is one run, what retrieval "
                       "reads), or token by token (format version 1's order, for comparing)")
    serve.add_argument("--journal-blocks", type=_positive_int, default=0,
                       help="when formatting: the journal's length in logical blocks "
                       "(default about 1%% of the media)")
    serve.add_argument("-v", "--verbose", action="store_true", help="log at debug level")


def _add_format(sub: argparse._SubParsersAction):
    """`format`."""
    fmt = sub.add_parser("format", help="create a fresh ssdemu device on the media")
    fmt.add_argument("--media", required=True,
                     help="file:PATH[:SIZE], block:/dev/NAME or mem:SIZE")
    fmt.add_argument("--profile", default="star2000d",
                     help="the device profile whose index size and largest value to use")
    fmt.add_argument("--journal-blocks", type=_positive_int, default=0,
                     help="journal length in logical blocks (default: about 1%% of the "
                     "media); a checkpoint reclaims it whenever it fills")


def _add_ctl(sub: argparse._SubParsersAction):
    """`ctl` and its admin commands, faults among them."""
    ctl = sub.add_parser("ctl", help="admin commands against a running daemon")
    ctl.add_argument("--socket", required=True)
    ctl.add_argument("--json", action="store_true", help="print one JSON object")
    ctl.add_argument("--owner-key-file", metavar="FILE",
                     help="act as the owner of this key (ssdemu owner-key): its namespaces "
                     "and fault rules (default: $SSDEMU_OWNER_KEY_FILE, else the uid alone)")
    csub = ctl.add_subparsers(dest="ctl", required=True, parser_class=_Parser)
    csub.add_parser("identify", help="what the device is")
    nl = csub.add_parser("ns-list", help="namespaces")
    nl.add_argument("--all-owners", action="store_true",
                    help="every owner's, with its uid (an admin's request)")
    nc = csub.add_parser("ns-create", help="create a namespace")
    nc.add_argument("size", type=_size_arg, help="bytes, with K/M/G/T (0: for keys only)")
    nc.add_argument("--shared", action="store_true",
                    help="every client may use it (default: only its owner)")
    nd = csub.add_parser("ns-delete", help="delete a namespace")
    nd.add_argument("nsid", type=_positive_int)
    nd.add_argument("--any-owner", action="store_true",
                    help="whoever owns it (an admin's request: reclaim another's space)")
    lg = csub.add_parser("log", help="a log page (1: counters, latency, bytes copied)")
    lg.add_argument("page", type=_positive_int, nargs="?", default=1)
    ft = csub.add_parser("fault", help="inject faults, for testing the software above the "
                         "drive (an admin anywhere; an owner into its own namespaces)")
    fsub = ft.add_subparsers(dest="fault", required=True, parser_class=_Parser)
    for kind, what in (("read-error", "reads fail with MEDIA_ERROR"),
                       ("write-error", "writes fail with MEDIA_ERROR"),
                       ("latency", "commands complete later")):
        fp = fsub.add_parser(kind, help=what + " (block commands and KV values)")
        fp.add_argument("--nsid", type=_nonnegative_int,
                        help="only this namespace (default: every one; 0: KV's default)")
        fp.add_argument("--lba", type=_lba_range,
                        help="only block commands touching FIRST:COUNT of --nsid")
        fp.add_argument("--key", help="only KV commands on this key (hex, 1-16 bytes)")
        fp.add_argument("--count", type=_nonnegative_int, default=0,
                        help="end after hitting this many commands (default 0: until clear)")
        fp.add_argument("--probability", type=_positive_float, default=1.0,
                        help="hit each matching command with this probability (0 < P <= 1)")
        fp.add_argument("--seed", type=_nonnegative_int, default=0,
                        help="the rule's random sequence: the same seed, the same faults")
        if kind == "latency":
            fp.add_argument("--us", type=_positive_float, required=True,
                            help="microseconds added to each hit command's completion")
            fp.add_argument("--directions", choices=("both", "read", "write"),
                            default="both")
    fc = fsub.add_parser("clear", help="remove a fault rule, or all")
    fc.add_argument("id", type=_positive_int, nargs="?", default=0)
    fsub.add_parser("list", help="the fault rules in force")
    fr = fsub.add_parser("remove", help="surprise removal: every client sees the device gone")
    fr.add_argument("--seconds", type=_finite_float, default=0,
                    help="it comes back after this long (default: at 'fault reinsert')")
    fsub.add_parser("reinsert", help="end a surprise removal")
    fpc = fsub.add_parser("power-cut", help="lose power: writes no flush covered may be lost, "
                          "the drive powers on again (serve --power-cut)")
    fpc.add_argument("--seed", type=_nonnegative_int, default=0,
                     help="which writes are lost: the same seed, the same outcome")


def _add_mounts(sub: argparse._SubParsersAction):
    """`mount` and `fs`: the drive for unmodified software (ssdemu/tools/mount.py)."""
    mt = sub.add_parser("mount", help="the namespaces this client owns as files DIR/nsN "
                        "(FUSE, in the foreground: SIGTERM or Ctrl-C unmounts)")
    mt.add_argument("--socket", required=True)
    mt.add_argument("--owner-key-file", help="the owner key the namespaces were created with "
                    "(default $SSDEMU_OWNER_KEY_FILE)")
    mt.add_argument("dir")
    fs = sub.add_parser("fs", help="ext4 on a namespace (through the mount and a loop device), "
                        "and its undoing")
    fsub = fs.add_subparsers(dest="fs", required=True)
    up = fsub.add_parser("up", help="mount ext4 on namespace NSID at DIR")
    up.add_argument("--socket", required=True)
    up.add_argument("--nsid", type=_positive_int, required=True)
    up.add_argument("--mkfs", action="store_true", help="make the filesystem first (mkfs.ext4 "
                    "-F: what the namespace held is lost)")
    up.add_argument("--owner-key-file")
    up.add_argument("dir")
    down = fsub.add_parser("down", help="unmount DIR, detach its loop device, unmount the drive")
    down.add_argument("dir")
    cr = fsub.add_parser("crash", help="power cuts under ext4 on namespace NSID while writers "
                         "fsync files: fsynced files lost or corrupt, e2fsck after each (the "
                         "daemon: serve --power-cut on file: or block: media)")
    cr.add_argument("--socket", required=True)
    cr.add_argument("--nsid", type=_positive_int, required=True)
    cr.add_argument("--cycles", type=_positive_int, default=20)
    cr.add_argument("--seconds", type=_positive_float, default=1.0,
                    help="writing before each cut (0.5x to 1.5x of it)")
    cr.add_argument("--seed", type=_nonnegative_int, default=0)
    cr.add_argument("--dir", help="where its mount points go (default: a temp dir)")
    cr.add_argument("--json", action="store_true", help="print one JSON object")


def _add_tools(sub: argparse._SubParsersAction):
    """`owner-key`, `stat`, `torture` and `sweep`."""
    ok = sub.add_parser("owner-key", help="write a new owner key (mode 0600): what a client "
                        "presents to own namespaces, in place of a name anyone could claim")
    ok.add_argument("file", help="where to write it (must not exist)")

    sp = sub.add_parser("stat", help="a live per-interval table of a running drive (IOPS, "
                        "MB/s, latency, queue depth, compute), as iostat")
    sp.add_argument("--socket", required=True)
    sp.add_argument("interval", type=_positive_float, nargs="?", default=1.0,
                    help="seconds between rows (default 1)")
    sp.add_argument("--count", type=_positive_int, help="stop after this many rows")

    tt = sub.add_parser("torture", help="soak and torture the daemon: crash loops, a ring "
                        "fuzzer, client kills, multi-client load; counts what was lost")
    tt.add_argument("--seconds", type=_positive_float, default=60)
    tt.add_argument("--seed", type=_nonnegative_int, default=0)
    tt.add_argument("--dir", help="where its media and sockets go (default: the temp dir)")
    tt.add_argument("--json", action="store_true", help="print one JSON object")

    sw = sub.add_parser("sweep", help="a grid of replays (a YAML spec) as tasks on Ray: this "
                        "machine, or a cluster with --address")
    sw.add_argument("spec", help="the grid (docs/sweeps.md; a sample: traces/sweep-sample.yaml)")
    sw.add_argument("--address", help="a Ray cluster (ray start --head prints it); default: a "
                    "local Ray instance on this machine")
    sw.add_argument("--out", help="where cells/ and results.csv go (default: "
                    "./sweep-SPECNAME); cells already there are not run again")
    sw.add_argument("--plot", action="store_true", help="sweep_capacity.png and "
                    "sweep_prefill.png into --out")
    sw.add_argument("--retry-failed", action="store_true", help="run the failed cells again")
    sw.add_argument("--no-progress", action="store_true", help="no progress bar")
    sw.add_argument("--json", action="store_true", help="print one JSON object")


def _add_replay(sub: argparse._SubParsersAction):
    """`replay`."""
    rp = sub.add_parser("replay", help="replay a Mooncake KV-cache trace through the serving "
                        "model and the drive, in virtual time")
    rp.add_argument("trace", help="a Mooncake JSONL trace")
    rp.add_argument("--profile", default="star2000d")
    rp.add_argument("--model", default="llama-3-8b", help="llama-3-8b, qwen2.5-7b, tiny or "
                    "smollm2-135m (data mode: its real KV of real text)")
    rp.add_argument("--mode", choices=("model", "data"), default="model",
                    help="model: sizes only, in this process; data: real KV bytes through "
                    "a daemon (--socket or --media)")
    rp.add_argument("--quant", default="int8_g64",
                    help="the drive's in-drive quantization scheme ('none': fp16)")
    rp.add_argument("--capacity", default="hbm=0,dram=0,drive=unbounded",
                    help="hbm=SIZE,dram=SIZE,drive=SIZE; SIZE bytes, blocks:N or unbounded")
    rp.add_argument("--prefill-rate", type=_prefill_rate, default="auto",
                    help="the modelled GPU's prefill tokens/s; 'auto' (the default): the rate "
                    "at which the no-drive baseline is offered 0.8 of its capacity (a GPU that "
                    "keeps up, so that TTFT without the drive is not that of an overloaded "
                    "GPU); 'model': the model config's own rate; or a number")
    rp.add_argument("--requests", type=_positive_int, metavar="N",
                    help="replay only the first N requests")
    rp.add_argument("--socket", help="data mode: a running daemon started with --clock virtual")
    rp.add_argument("--media", help="data mode: start a daemon on this media (formatted "
                    "first), stop it afterwards")
    rp.add_argument("--decode", metavar="MODES",
                    help="decode each request's output tokens against its KV in the drive "
                    "and report TPOT: dense (all KV over the link each step), host-select "
                    "(page summaries and chosen pages), drive-select (selection and "
                    "attention in the drive), or a KV placement policy (streaming, h2o, "
                    "random, contiguity, qevict, predictive: docs/tiers.md); several, "
                    "comma-separated, a report each")
    rp.add_argument("--decode-budget", type=_positive_float, default=25.0, metavar="PCT",
                    help="a placement policy's HBM, percent of each request's context")
    rp.add_argument("--drift", metavar="FILE", help="the attention-drift model carrying the "
                    "real model's measurements to the trace: an `eval --policies --json` "
                    "report, or a fitted model (default: the bundled fit)")
    rp.add_argument("--dequant", choices=("drive", "host"), default="drive",
                    help="where the drive's quantized blocks are dequantized: in the drive "
                    "(fp16 crosses the link) or on the GPU (the compressed block crosses it)")
    rp.add_argument("--gpu-dequant-rate", type=_positive_float, metavar="GB_PER_S",
                    help="--dequant host: the GPU's dequantization rate in GB/s of fp16 "
                    "output (default 650)")
    rp.add_argument("--store-when", choices=("arrival", "computed"), default="arrival",
                    help="a request's blocks enter the tiers and the drive at its arrival "
                    "(hits on KV not computed yet are counted) or once its prefill has "
                    "computed them")
    rp.add_argument("--store-queue", type=_positive_int, metavar="N",
                    help="admission control: at most N background stores in flight per "
                    "drive; stores past it are dropped and counted (default: no limit)")
    rp.add_argument("--threads", type=_threads, default="auto", metavar="{1,2,auto}",
                    help="model mode: threads booking the timing model (2: a helper thread "
                    "books half of each request's dies, identical figures; auto, the "
                    "default: 2 when a core is free for the helper at the start, else 1)")
    rp.add_argument("--instances", type=_positive_int, default=1, metavar="K",
                    help="serving instances, each with its own GPU, HBM, DRAM and drive")
    rp.add_argument("--pool", choices=("private", "pooled"), default="private",
                    help="private: instance k sees only its own drive; pooled: the K drives "
                    "are one store (a block on the drive its key hashes to, remote hits over "
                    "the fabric)")
    rp.add_argument("--route", choices=("round-robin", "prefix"), default="round-robin",
                    help="request i to instance i mod K, or to the instance holding most of "
                    "its prefix")
    rp.add_argument("--fabric", metavar="GB_PER_S,LATENCY_US",
                    help="the pool's network per node (default 25,5: a 200 Gb/s RDMA NIC)")
    rp.add_argument("--skip-bad", action="store_true", help="skip and count bad trace lines")
    rp.add_argument("--plot", metavar="DIR", help="write hit_ratio.png, ttft_cdf.png and "
                    "drive_utilization.png into DIR")
    rp.add_argument("--no-progress", action="store_true", help="no progress bar")
    rp.add_argument("--json", action="store_true", help="print one JSON object")


def _name_list(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return names


def _percent_list(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected percentages, got {text!r}") from None
    if not values or any(not 0 < v <= 100 for v in values):
        raise argparse.ArgumentTypeError(f"percentages are in (0, 100], got {text!r}")
    return values


def _add_eval(sub: argparse._SubParsersAction) -> None:
    """`eval`."""
    from ssdemu.bench.model_eval import DEFAULT_TEXT, METHODS, SCHEMES

    ev = sub.add_parser("eval", help="a real model (SmolLM2-135M) decodes through the drive: "
                        "perplexity, greedy agreement and attention mass beside the modelled "
                        "decode step, per scheme, method and page budget")
    ev.add_argument("--text", default=DEFAULT_TEXT, help="a UTF-8 text (default: the GPL)")
    ev.add_argument("--context", type=_size_list, default=(512,),
                    help="tokens of context: one length or several (1K,2K), a report each")
    ev.add_argument("--held", type=_positive_int, default=32,
                    help="tokens decoded after it (teacher-forced: the perplexity's span)")
    ev.add_argument("--schemes", type=_name_list, default=SCHEMES,
                    help=f"the drive's quantization of the KV (default {','.join(SCHEMES)})")
    ev.add_argument("--methods", type=_name_list, default=tuple(METHODS),
                    help=f"how decode reads the KV ({', '.join(METHODS)})")
    ev.add_argument("--budgets", type=_percent_list, default=(3.0, 6.0, 12.0),
                    help="drive-select's page budgets, percent of the context's pages")
    ev.add_argument("--profiles", type=_name_list, default=("star2000d", "pcie4-tlc"))
    ev.add_argument("--passkey", type=_size_list, metavar="LENGTHS",
                    help="passkey retrieval instead, at these prompt lengths in tokens "
                    "(e.g. 1K,2K): each method's accuracy at the largest --budgets")
    ev.add_argument("--trials", type=_positive_int, default=20, help="passkey prompts a length")
    ev.add_argument("--policies", type=_name_list, metavar="NAMES",
                    help="KV placement policies instead (ssdemu/llm/policies: streaming, h2o, "
                    "random, contiguity, drive-select, qevict, qevict-2bit, predictive, or "
                    "all): each one's quality, Future Missed Mass, bytes moved and modelled "
                    "TPOT per memory budget, on the first of --profiles")
    ev.add_argument("--memory-budgets", type=_percent_list, default=(12.5, 25.0, 50.0),
                    metavar="PCTS", help="with --policies: HBM budgets, percent of the context")
    ev.add_argument("--seed", type=_nonnegative_int, default=0)
    ev.add_argument("--model-file", help="a Llama GGUF (default: SmolLM2-135M-Instruct)")
    ev.add_argument("--socket", help="a running daemon (default: one started here)")
    ev.add_argument("--plot", metavar="DIR", help="write quality_vs_tpot.png into DIR")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev.add_argument("--json", action="store_true", help="print one JSON object")


def _add_bench(sub: argparse._SubParsersAction) -> None:
    """`bench` and its benchmarks."""
    bench = sub.add_parser("bench", help="benchmarks (one JSON object with --json)")
    bsub = bench.add_subparsers(dest="bench", required=True, parser_class=_Parser)
    _add_bench_io(bsub)
    _add_bench_unmodified(bsub)
    _add_bench_keepup(bsub)
    _add_bench_model(bsub)


def _add_bench_io(bsub: argparse._SubParsersAction):
    """The benchmarks of the I/O path: io, queue, kv, lmcache, hops."""
    io = bsub.add_parser("io", help="the io_uring engine against fio on the same media")
    io.add_argument("--media", required=True, help="file:PATH[:SIZE], block:/dev/NAME, mem:SIZE")
    io.add_argument("--rw", default="randread",
                    choices=("read", "write", "randread", "randwrite"))
    io.add_argument("--bs", type=_size_arg, default=4096, help="block size (e.g. 4k, 1M)")
    io.add_argument("--qd", type=_positive_int, default=32, help="queue depth")
    io.add_argument("--seconds", type=_positive_float, default=5.0)
    io.add_argument("--repeat", type=_positive_int, default=1,
                    help="run ours and fio this many times (ABBA order); report medians")
    io.add_argument("--prefill", choices=("auto", "yes", "no"), default="auto",
                    help="write the media before reading (auto: when it is memory or sparse)")
    io.add_argument("--sqpoll", action="store_true", help="run our ring with SQPOLL")
    io.add_argument("--submit-batch", type=int, default=1, metavar="N",
                    help="I/Os per submit call, both sides (fio's iodepth_batch_submit, "
                    "default 1 as fio's; 0: all that are ready)")
    io.add_argument("--json", action="store_true", help="print one JSON object")

    qb = bsub.add_parser("queue", help="the queue and daemon: NOP round trips, 4 KiB reads "
                         "through the queue against fio, bytes copied")
    qb.add_argument("--socket", help="a running daemon (default: start one on --media)")
    qb.add_argument("--media", default="mem:512M", help="media of the daemon started here")
    qb.add_argument("--seconds", type=_positive_float, default=5.0)
    qb.add_argument("--ns-size", type=_size_arg, default=256 << 20,
                    help="namespace the reads run over")
    qb.add_argument("--neighbours", type=_nonnegative_int, default=0, metavar="N",
                    help="N CPU-bound processes beside the run and its baseline (a busy "
                    "machine anyone can reproduce)")
    qb.add_argument("--json", action="store_true", help="print one JSON object")

    kb = bsub.add_parser("kv", help="KV and compute commands against block commands of the "
                         "same sizes through the same queue, and the firmware kernels")
    kb.add_argument("--socket", help="a running daemon (default: start one on --media)")
    kb.add_argument("--media", default=None, help="media of the daemon started here "
                    "(default mem:1536M, sized to the workload)")
    kb.add_argument("--seconds", type=_positive_float, default=2.0, help="per figure")
    kb.add_argument("--neighbours", type=_nonnegative_int, default=0, metavar="N",
                    help="N CPU-bound processes beside the run and its baseline (a busy "
                    "machine anyone can reproduce)")
    kb.add_argument("--json", action="store_true", help="print one JSON object")

    lb = bsub.add_parser("lmcache", help="LMCache storing and retrieving Llama-style chunks "
                         "through the ssdemu plug-in and through its own local-disk backend")
    lb.add_argument("--chunks", type=_positive_int, default=16, help="32 MiB chunks (16)")
    lb.add_argument("--dir", help="the filesystem both use (default /var/tmp)")
    lb.add_argument("--quant", default="none", help="the plug-in's quant setting")
    lb.add_argument("--on-drive", action="store_true", help="LocalDisk once more, its folder "
                    "on ext4 on the drive (ssdemu fs up)")
    lb.add_argument("--json", action="store_true", help="print one JSON object")

    hb = bsub.add_parser("hops", help="the hops of a remote KV retrieve on this machine: a "
                         "local drive get, a TCP transfer of the same bytes, memcpy")
    hb.add_argument("--socket", help="a running daemon (default: start one, --timing off)")
    hb.add_argument("--value", type=_size_arg, default=32 << 20,
                    help="the value's size (default 32M: an LMCache chunk of Llama-3-8B)")
    hb.add_argument("--rounds", type=_positive_int, default=20)
    hb.add_argument("--json", action="store_true", help="print one JSON object")

    fb = bsub.add_parser("fairness", help="one client's worst legal retrievals (each bound of "
                         "a command) against another client's one-block TOPK and NOPs, and "
                         "the daemon's memory")
    fb.add_argument("--media", default="mem:1G", help="media of the daemon started here")
    fb.add_argument("--profile", help="the daemon's profile (default: its own)")
    fb.add_argument("--seconds", type=_positive_float, default=5.0,
                    help="the victim's TOPKs, then its NOPs, this long per hog")
    fb.add_argument("--hogs", default="memory,keys,scored,rerank,result",
                    help="which worst cases, comma-separated (memory, keys, scored, rerank, "
                         "result)")
    fb.add_argument("--neighbours", type=_nonnegative_int, default=0, metavar="N",
                    help="N CPU-bound processes beside the whole run, the victim alone "
                    "included (a busy machine anyone can reproduce)")
    fb.add_argument("--json", action="store_true", help="print one JSON object")


def _add_bench_unmodified(bsub: argparse._SubParsersAction):
    """`bench stack` and `bench mlperf-kv`: unmodified software on the drive."""
    sk = bsub.add_parser("stack", help="4 KiB random reads through each layer in one run: the "
                         "raw media, the queue, fio's engine, the mount, ext4 on the mount")
    sk.add_argument("--media", default="mem:1G")
    sk.add_argument("--timing", default="off", help="off (the layers alone, default) or a "
                    "profile name (the drive's time in every layer but the media's)")
    sk.add_argument("--seconds", type=_positive_float, default=2.0, help="each cell's run")
    sk.add_argument("--size", type=_size_arg, default=256 << 20, help="bytes read over")
    sk.add_argument("--json", action="store_true", help="print one JSON object")

    mk = bsub.add_parser("mlperf-kv", help="the MLPerf Storage KV-cache benchmark (a checkout "
                         "of it), unmodified, its file backend on ext4 on the drive and on "
                         "the machine's own disk")
    mk.add_argument("--benchmark", required=True, help="the checkout's kv_cache_benchmark "
                    "folder (its kv-cache.py)")
    mk.add_argument("--users", type=_positive_int, default=8)
    mk.add_argument("--duration", type=_positive_int, default=20, help="seconds a run")
    mk.add_argument("--capacity-gb", type=_positive_float, default=1.0,
                    help="its storage tier (--storage-capacity-gb)")
    mk.add_argument("--profile", default="star2000d")
    mk.add_argument("--dir", help="the machine's own disk for the second run (default /var/tmp)")
    mk.add_argument("--json", action="store_true", help="print one JSON object")


def _add_bench_keepup(bsub: argparse._SubParsersAction):
    """The real clock's retrieval: each command's host lag past its modelled time."""
    ku = bsub.add_parser("keepup", help="on the real clock, a long context's decode steps "
                         "(every layer's TOPK_PAGES with the default re-rank, then ATTEND): "
                         "each command's host lag past its modelled completion")
    ku.add_argument("--context", type=_positive_int, default=4096,
                    help="tokens stored (a multiple of 64; default 4096)")
    ku.add_argument("--tokens", type=_positive_int, default=64,
                    help="decoded tokens measured (default 64)")
    ku.add_argument("--budget", type=_positive_float, default=12.0,
                    help="pages selected, %% of the context's (default 12)")
    ku.add_argument("--rerank", type=_positive_int, default=4,
                    help="the re-rank's candidates per selected page (default 4: the drive's)")
    ku.add_argument("--profile", help="the daemon's profile (default: its own)")
    ku.add_argument("--media", default="mem:2G", help="media of the daemon started here")
    ku.add_argument("--kv-layout", choices=("head", "token"), default="head",
                    help="the daemon's block layout (serve --kv-layout)")
    ku.add_argument("--neighbours", type=_nonnegative_int, default=0, metavar="N",
                    help="N CPU-bound processes beside the run (a busy machine anyone can "
                    "reproduce)")
    ku.add_argument("--json", action="store_true", help="print one JSON object")


def _add_bench_model(bsub: argparse._SubParsersAction):
    """The benchmarks of the model and the firmware: device, replay, retrieval,
    firmware."""
    dv = bsub.add_parser("device", help="the timing model in virtual time against the "
                         "figures its profile is calibrated to (fresh and steady state)")
    dv.add_argument("--profile", default="star2000d")
    dv.add_argument("--precondition", action="store_true",
                    help="run the read and latency phases on the preconditioned drive (filled "
                    "twice, then random-overwritten to steady state) instead of a fresh one")
    dv.add_argument("--logical", type=_size_arg, default=None,
                    help="the FTL's logical space at scale (default: four write caches, at "
                    "least 8G)")
    dv.add_argument("--json", action="store_true", help="print one JSON object")

    rb = bsub.add_parser("replay", help="model-mode replay of a whole trace (the CLI call) "
                         "against the page-by-page timing model")
    rb.add_argument("--trace", help="a Mooncake JSONL trace (default: the bundled sample)")
    rb.add_argument("--model", default="llama-3-8b")
    rb.add_argument("--profile", default="star2000d")
    rb.add_argument("--quant", default="int8_g64")
    rb.add_argument("--no-baseline", action="store_true", help="skip the page-by-page run")
    rb.add_argument("--bounded", type=_positive_int, default=None, metavar="BLOCKS",
                    help="also replay with a drive tier of BLOCKS blocks (every miss evicts, "
                    "GC runs) after each unbounded run, and report its time as a ratio")
    rb.add_argument("--repeat", type=_positive_int, default=1, metavar="N",
                    help="N runs (with --bounded: N pairs, one after the other); medians")
    rb.add_argument("--neighbours", type=_nonnegative_int, default=0, metavar="N",
                    help="N CPU-bound processes beside the run and its baseline")
    rb.add_argument("--json", action="store_true", help="print one JSON object")

    rt = bsub.add_parser("retrieval", help="query-aware page selection: accuracy against dense "
                         "attention on a synthetic long-context suite, and the modelled cost "
                         "of a decode step (ship all KV, select on the host, select and "
                         "attend in the drive)")
    rt.add_argument("--lengths", type=_size_list, default=None,
                    help="context lengths in tokens, comma-separated, K/M suffixes "
                    "(default 32K,128K,1M)")
    rt.add_argument("--profiles", default="star2000d,pcie4-tlc",
                    help="profiles for the cost half, comma-separated")
    rt.add_argument("--seed", type=_nonnegative_int, default=0)
    rt.add_argument("--model-context", type=_nonnegative_int, default=2048, metavar="TOKENS",
                    help="the same metrics on the real model's keys (SmolLM2-135M) at this "
                    "context; 0: the synthetic suite alone")
    rt.add_argument("--model-file", default=None,
                    help="a Llama GGUF for that part (default: SmolLM2-135M-Instruct)")
    rt.add_argument("--layout-context", type=_nonnegative_int, default=2048, metavar="TOKENS",
                    help="the drive's re-rank and ATTEND on blocks laid out by head against "
                    "token by token (two daemons), at this context, on Gaussian KV and (with "
                    "--model-context) on the real model's; 0: skip")
    rt.add_argument("--layout-scheme", default="plain",
                    help="the blocks' scheme for that part (plain, or an integer scheme)")
    rt.add_argument("--json", action="store_true", help="print one JSON object")

    fb = bsub.add_parser("forward", help="the real model's CPU forward (numpy) against torch on "
                         "the same weights (when importable) and against memcpy")
    fb.add_argument("--context", type=_positive_int, default=2048, help="tokens of context")
    fb.add_argument("--steps", type=_positive_int, default=8, help="tokens decoded")
    fb.add_argument("--model-file", default=None,
                    help="a Llama GGUF (default: SmolLM2-135M-Instruct)")
    fb.add_argument("--json", action="store_true", help="print one JSON object")

    fw = bsub.add_parser("firmware", help="in-drive kernels against memcpy and Python")
    fw.add_argument("--json", action="store_true", help="print one JSON object")
    fw.add_argument("--mib", type=_positive_int, default=64,
                    help="KV data per kernel call, MiB of fp16")
    fw.add_argument("--prefix-chains", type=_positive_int, default=1024,
                    help="chains of 1,024 keys in the prefix-match index")



def _cmd_bench_io(args) -> int:
    from ssdemu.bench.io import bench_io, format_table

    if args.qd > 4096:
        raise ValueError("--qd must be at most 4096")
    if not 0 <= args.submit_batch <= args.qd:
        raise ValueError("--submit-batch must be between 0 and --qd")
    report = bench_io(args.media, rw=args.rw, bs=args.bs, qd=args.qd, seconds=args.seconds,
                      repeat=args.repeat, prefill_mode=args.prefill, sqpoll=args.sqpoll,
                      submit_batch=args.submit_batch)
    print(json.dumps(report) if args.json else format_table(report))
    return 0


def _cmd_bench_retrieval(args) -> int:
    from ssdemu.bench.retrieval import LENGTHS, bench_retrieval, format_table
    from ssdemu.sim.profile import load

    profiles = [p for p in args.profiles.split(",") if p]
    for p in profiles:
        load(p)  # a bad name says so before minutes of work
    lengths = args.lengths or LENGTHS
    if min(lengths) < 1024:
        raise ValueError("--lengths: contexts of at least 1K tokens (a 1% budget needs pages)")
    if args.model_context and args.model_context < 1024:
        raise ValueError("--model-context: at least 1K tokens (a 1% budget needs pages), or 0")
    if args.layout_context and args.layout_context % 64:
        raise ValueError("--layout-context: a multiple of 64 tokens (the blocks'), or 0")
    from firmware.quant import parse_scheme

    parse_scheme(args.layout_scheme)  # a bad name says so before minutes of work
    report = bench_retrieval(tuple(lengths), tuple(profiles), args.seed,
                             model_context=args.model_context, model_path=args.model_file,
                             layout_context=args.layout_context,
                             layout_scheme=args.layout_scheme)
    print(json.dumps(report) if args.json else format_table(report))
    return 0


@contextlib.contextmanager
def _eval_progress(args):
    """eval's progress callback (None with --no-progress or --json): a bar made at the first
    run done, so that a failure before prints its line alone."""
    bars = []

    def progress(done, total):
        if not bars:
            from tqdm import tqdm

            bars.append(tqdm(total=total, unit="run", desc="eval", leave=False))
        bars[0].update(done - bars[0].n)

    try:
        yield progress if not args.no_progress and not args.json else None
    finally:
        for bar in bars:
            bar.close()


def _print_passkey(report: dict, as_json: bool) -> int:
    print(json.dumps(report) if as_json else "\n".join(
        f"passkey at {n} tokens ({report['trials']} trials): " + ", ".join(
            f"{m} {a:.2f}" for m, a in acc.items())
        for n, acc in report["accuracy"].items()))
    return 0


def _cmd_eval_tiers(args) -> int:
    """`eval --policies`: ssdemu/bench/tier_eval.py."""
    from ssdemu.bench.tier_eval import TierSpec, evaluate, format_table, passkey, plot
    from ssdemu.llm.policies import POLICIES
    from ssdemu.sim.profile import load

    names = tuple(POLICIES) if args.policies == ("all",) else args.policies
    bad = [n for n in names if n not in POLICIES]
    if bad:
        raise ValueError(f"--policies: unknown {', '.join(bad)} (one of "
                         f"{', '.join(POLICIES)}, or all)")
    load(args.profiles[0])  # a bad name says so before the model loads
    if min(args.context) < 256:
        raise ValueError("--context: at least 256 tokens with --policies (four windows)")
    spec = TierSpec(text=args.text, contexts=tuple(args.context), held=args.held,
                    policies=names, budgets_pct=args.memory_budgets,
                    profile=args.profiles[0], seed=args.seed, model_path=args.model_file)
    with _eval_progress(args) as show:
        report = (passkey(spec, args.passkey, args.trials, args.socket, show) if args.passkey
                  else evaluate(spec, args.socket, show))
    if args.passkey:
        return _print_passkey(report, args.json)
    if args.plot:
        for r in report["reports"]:
            r["plot"] = plot(r, args.plot)
    print(json.dumps(report) if args.json else "\n\n".join(
        format_table(r) for r in report["reports"]))
    return 0


def _cmd_eval(args) -> int:
    if args.policies:
        return _cmd_eval_tiers(args)
    from ssdemu.bench.model_eval import (
        METHODS,
        EvalSpec,
        evaluate,
        format_table,
        passkey,
        plot,
    )
    from ssdemu.sim.profile import load

    bad = [m for m in args.methods if m not in METHODS]
    if bad:
        raise ValueError(f"--methods: unknown {', '.join(bad)} (one of {', '.join(METHODS)})")
    for name in args.profiles:
        load(name)  # a bad name says so before the model loads
    if min(args.context) < 64:
        raise ValueError("--context: at least 64 tokens (a block)")
    context = args.context[0] if len(args.context) == 1 else tuple(args.context)
    spec = EvalSpec(text=args.text, context=context, held=args.held,
                    schemes=args.schemes, methods=args.methods, budgets_pct=args.budgets,
                    profiles=args.profiles, model_path=args.model_file)
    with _eval_progress(args) as show:
        report = (passkey(spec, args.passkey, args.trials, args.seed, args.socket, show)
                  if args.passkey else evaluate(spec, args.socket, show))
    if args.passkey:
        return _print_passkey(report, args.json)
    each = report.get("contexts", [report])
    if args.plot:
        for r in each:
            r["plot"] = plot(r, args.plot, "quality_vs_tpot.png" if len(each) == 1
                             else f"quality_vs_tpot_{r['context_tokens']}.png")
    print(json.dumps(report) if args.json else "\n\n".join(format_table(r) for r in each))
    return 0


def _cmd_bench_firmware(args) -> int:
    from ssdemu.bench.firmware import bench_firmware, format_table

    report = bench_firmware(mib=args.mib, prefix_chains=args.prefix_chains)
    print(json.dumps(report) if args.json else format_table(report))
    return 0


def _cmd_serve(args) -> int:
    import logging

    from ssdemu.device.daemon import check_socket_path, serve
    from ssdemu.device.media import open_media
    from ssdemu.device.quotas import Quotas
    from ssdemu.sim.profile import load
    from ssdemu_wire import owner_key

    check_socket_path(args.socket)  # before anything is opened, formatted or logged
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s ssdemu[%(process)d] %(levelname)s %(message)s")
    profile = load(args.profile)
    admin_key = owner_key.load(args.admin_key) if args.admin_key else None
    with open_media(args.media) as media:
        quotas = Quotas(queue_pairs=args.max_queue_pairs, buffers=args.max_buffers,
                        buffer_bytes=args.max_buffer_bytes, inflight=args.max_inflight,
                        namespaces=args.max_namespaces,
                        namespace_bytes=args.max_namespace_bytes, pins=args.max_pins)
        return serve(profile, media, args.socket, {os.getuid(), 0, *args.allow_uid},
                     args.format, args.timing, args.clock, args.journal_blocks, args.group,
                     quotas, args.power_cut, args.metrics, admin_key=admin_key,
                     poll=args.poll, realtime=args.realtime, media_io=args.media_io,
                     kv_layout=args.kv_layout, retrieval_host_bytes=args.retrieval_host_bytes)


def _cmd_mount(args) -> int:
    from ssdemu.tools import mount

    cmd = mount.argv(args.socket, args.dir, args.owner_key_file)
    sys.stdout.flush()
    os.execv(cmd[0], cmd)  # the mount itself, in this process: its signals, its exit code


def _fs_crash(args) -> int:
    import shutil
    import tempfile

    from ssdemu.tools.fs_crash import crash_cycles

    work = args.dir or tempfile.mkdtemp(prefix="ssdemu-crash-")
    try:
        r = crash_cycles(args.socket, args.nsid, args.cycles, work, seconds=args.seconds,
                         seed=args.seed,
                         progress=None if args.json else lambda o: print(
                             f"cycle {o['cycles']}: {o['files_written']} files fsynced, "
                             f"{o['durable_files']} kept, "
                             f"lost {len(o['lost'])}, corrupt {len(o['corrupt'])}, e2fsck "
                             f"unclean {len(o['fsck_unclean'])}", flush=True))
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    bad = r["lost"] or r["corrupt"] or r["fsck_unclean"]
    print(json.dumps(r) if args.json else
          f"{r['cycles']} power cuts, {r['files_written']} files fsynced: {len(r['lost'])} "
          f"lost, {len(r['corrupt'])} corrupt, e2fsck unclean {len(r['fsck_unclean'])} times")
    return 1 if bad else 0


def _cmd_fs(args) -> int:
    from ssdemu.tools import mount

    if args.fs == "crash":
        return _fs_crash(args)
    if args.fs == "up":
        loop = mount.fs_up(args.socket, args.nsid, args.dir, mkfs=args.mkfs,
                           owner_key_file=args.owner_key_file)
        print(f"ext4 on namespace {args.nsid} at {args.dir} ({loop}); undo: ssdemu fs down "
              f"{args.dir}")
    else:
        mount.fs_down(args.dir)
        print(f"{args.dir} unmounted, its loop device detached, the drive unmounted")
    return 0


def _cmd_owner_key(args) -> int:
    from ssdemu_wire import owner_key

    owner_key.new(args.file)
    print(f"wrote a new owner key to {args.file} (mode 0600): connect with "
          f"owner_key_file={args.file!r} or SSDEMU_OWNER_KEY_FILE={args.file}")
    return 0


def _cmd_format(args) -> int:
    from ssdemu.device.media import open_media
    from ssdemu.device.store import Store
    from ssdemu.sim.profile import load

    kv = load(args.profile).kv
    with open_media(args.media) as media:
        store = Store.format(media, index_keys=kv.index_keys, max_value=kv.max_value_bytes,
                             journal_blocks=args.journal_blocks)
        print(f"formatted {media.spec}: {store.d_len} bytes of data region, index of "
              f"{store.index_keys} keys, journal {store.j_len} bytes")
        store.close()
    return 0


def _cmd_bench_forward(args) -> int:
    from ssdemu.bench.forward import bench_forward

    report = bench_forward(args.context, args.steps, model_path=args.model_file)
    print(json.dumps(report) if args.json else json.dumps(report, indent=1))
    return 0


def _cmd_bench_lmcache(args) -> int:
    from ssdemu.bench.lmcache import bench_lmcache, format_table

    report = bench_lmcache(args.chunks, args.dir, args.quant, on_drive=args.on_drive)
    print(json.dumps(report) if args.json else format_table(report))
    return 0


def _cmd_bench_mlperf_kv(args) -> int:
    from ssdemu.bench.mlperf_file import bench_mlperf_kv, format_table

    report = bench_mlperf_kv(args.benchmark, users=args.users, duration=args.duration,
                             capacity_gb=args.capacity_gb, profile=args.profile,
                             where=args.dir)
    print(json.dumps(report) if args.json else format_table(report))
    return 0


def _cmd_bench_hops(args) -> int:
    from ssdemu.bench.hops import bench_hops, format_table

    report = bench_hops(args.socket, args.value, args.rounds)
    print(json.dumps(report) if args.json else format_table(report))
    return 0 if report["data_ok"] else EXIT_FAILURE


def _cmd_bench_fairness(args) -> int:
    from ssdemu.bench.fairness import KINDS, bench_fairness, format_table

    kinds = [k for k in args.hogs.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise SsdemuError(f"--hogs takes some of {', '.join(KINDS)}, got {args.hogs!r}")
    from ssdemu.bench.neighbours import Neighbours

    # a busy host: a change to how the workers are scheduled can win on a quiet one and
    # lose by seconds beside CPU-bound neighbours (a demoted worker holding the GIL)
    with Neighbours(args.neighbours):
        report = bench_fairness(args.media, args.seconds, tuple(kinds), args.profile)
    report["neighbours"] = args.neighbours
    print(json.dumps(report) if args.json else format_table(report))
    return 0


def _cmd_bench_keepup(args) -> int:
    from ssdemu.bench.keepup import bench_keepup, format_table
    from ssdemu.bench.neighbours import Neighbours

    try:
        with Neighbours(args.neighbours):
            report = bench_keepup(args.context, args.tokens, args.budget, args.rerank,
                                  args.profile, args.media, kv_layout=args.kv_layout)
    except ValueError as e:
        raise SsdemuError(str(e)) from None
    report["neighbours"] = args.neighbours
    print(json.dumps(report) if args.json else format_table(report))
    return 0


def _cmd_bench_kv(args) -> int:
    from ssdemu.bench.kv import bench_kv, format_table
    from ssdemu.bench.neighbours import Neighbours

    with Neighbours(args.neighbours):
        report = bench_kv(args.socket, args.media, args.seconds)
    report["neighbours"] = args.neighbours
    print(json.dumps(report) if args.json else format_table(report))
    return 0


def _cmd_bench_queue(args) -> int:
    from ssdemu.bench.neighbours import Neighbours
    from ssdemu.bench.queue import bench_queue, format_table

    with Neighbours(args.neighbours):
        report = bench_queue(args.socket, args.media, args.seconds, args.ns_size)
    report["neighbours"] = args.neighbours
    print(json.dumps(report) if args.json else format_table(report))
    return 0


def _cmd_bench_stack(args) -> int:
    from ssdemu.bench.stack import bench_stack, format_table

    report = bench_stack(args.media, args.timing, args.seconds, args.size)
    print(json.dumps(report) if args.json else format_table(report))
    return 0


def _cmd_stat(args) -> int:
    from ssdemu.tools.stat import run

    return run(args.socket, args.interval, args.count)


def _cmd_torture(args) -> int:
    from ssdemu.tools.torture import as_dict, summary, torture

    t = torture(args.seconds, args.seed, args.dir)
    print(json.dumps(as_dict(t)) if args.json else summary(t))
    bad = t.lost or t.corrupt or t.crashes or t.leaked_fds or t.leaked_pins
    return EXIT_FAILURE if bad else 0


def _cmd_ctl(args) -> int:
    from ssdemu.tools.ctl import run

    print(run(args))
    return 0


def _cmd_bench_device(args) -> int:
    from ssdemu.bench.device import bench_device, format_table

    if args.logical is not None and args.logical < MIN_BENCH_LOGICAL:
        print(f"ssdemu: error: --logical {args.logical} is under 64M: the FTL's lines need "
              "room (and the bench a write cache's worth of fresh writes)", file=sys.stderr)
        return EXIT_USAGE
    report = bench_device(args.profile, logical_bytes=args.logical,
                          do_precondition=args.precondition)
    print(json.dumps(report) if args.json else format_table(report))
    return 0


def _cmd_bench_replay(args) -> int:
    from ssdemu.bench.neighbours import Neighbours
    from ssdemu.bench.replay import bench_replay, format_table
    from traces.mooncake import SAMPLE

    with Neighbours(args.neighbours):
        report = bench_replay(str(args.trace or SAMPLE), args.model, args.profile, args.quant,
                              baseline=not args.no_baseline, bounded=args.bounded,
                              repeat=args.repeat)
    report["neighbours"] = args.neighbours
    print(json.dumps(report) if args.json else format_table(report))
    return 0


def _cmd_sweep(args) -> int:
    from ssdemu.replay.sweep import run_sweep

    out = args.out or f"sweep-{os.path.splitext(os.path.basename(args.spec))[0]}"
    r = run_sweep(args.spec, out, address=args.address, plot=args.plot,
                  retry_failed=args.retry_failed, progress=not args.no_progress)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"{r['cells']} cells: {r['ran']} run, {r['skipped']} already in {r['out']}, "
              f"{r['failed']} failed; table {r['table']}")
        for e in r["errors"]:
            print(f"  failed: {e['cell']}: {e['error']}")
        for p in r.get("plots", []):
            print(f"wrote {p}")
    return EXIT_FAILURE if r["failed"] else 0


def _cmd_replay(args) -> int:
    from ssdemu.replay.job import ReplayJob, run
    from ssdemu.replay.threads import auto_threads

    report = run(ReplayJob(
        trace=args.trace, profile=args.profile, model=args.model, mode=args.mode,
        quant=None if args.quant == "none" else args.quant, capacity=args.capacity,
        prefill_rate=args.prefill_rate, skip_bad=args.skip_bad, requests=args.requests,
        socket=args.socket, media=args.media, plot_dir=args.plot,
        progress=not args.no_progress, instances=args.instances, pool=args.pool,
        route=args.route, fabric=args.fabric, dequant=args.dequant,
        store_when=args.store_when, store_queue=args.store_queue,
        threads=auto_threads() if args.threads == "auto" else args.threads,
        decode=args.decode, decode_budget_pct=args.decode_budget, drift=args.drift,
        gpu_dequant_rate=(args.gpu_dequant_rate * 1e9 if args.gpu_dequant_rate else None)))
    if args.json:
        print(json.dumps(report))
    else:
        _print_replay(report)
    for warning in report.get("warnings", []):
        print(f"ssdemu: warning: {warning}", file=sys.stderr)
    if report.get("data", {}).get("data_errors"):
        print(f"ssdemu: error: {report['data']['data_errors']} blocks read back wrong",
              file=sys.stderr)
        return EXIT_FAILURE
    return 0


def _print_decode(d: dict) -> None:
    if "budget_pct" in d:  # a placement policy (ssdemu/replay/decode.py tier_report)
        print(f"decode ({d['mode']}, HBM {d['budget_pct']:g}% of the context): TPOT p50 / p99 "
              f"{d['tpot_s']['p50'] * 1e3:.2f} / {d['tpot_s']['p99'] * 1e3:.2f} ms, "
              f"{d['link_bytes_per_token_mean'] / 1e6:.2f} MB over the link and "
              f"{d['nand_bytes_per_token_mean'] / 1e6:.2f} MB on NAND per token, "
              f"{d['promotions_per_step']:.3f} promotions per step, Future Missed Mass "
              f"{d['future_missed_mass']:.3f} (drift model: {d['drift_model']})")
        return
    print(f"decode ({d['mode']}, {d['budget_tokens']:,}-token budget): TPOT p50 / p99 "
          f"{d['tpot_s']['p50'] * 1e3:.1f} / {d['tpot_s']['p99'] * 1e3:.1f} ms (GPU "
          f"{d['gpu_s_per_token'] * 1e3:.1f} ms + storage p50 "
          f"{d['storage_s_per_token']['p50'] * 1e3:.1f} ms), "
          f"{d['link_bytes_per_token_mean'] / 1e6:.2f} MB over the link per token")


def _print_replay(r: dict) -> None:
    t, u = r["ttft_s"], r["drive_utilization"]
    print(f"{r['mode']} mode: {r['requests']:,} requests, {r['blocks']:,} blocks of 512 "
          f"tokens, {r['model']} on {r['profile']} ({r['quant'] or 'fp16'}, compression "
          f"{r['compression_ratio']:.2f}x)")
    print(f"block hit ratio {r['block_hit_ratio']:.3f} ("
          + ", ".join(f"{k} {v:.3f}" for k, v in r["tier_hit_ratio"].items())
          + f"); prefill tokens saved {r['prefill_tokens_saved']:,}")
    print(f"TTFT p50 / p99 (modelled): with the drive {t['with_drive']['p50'] * 1e3:.1f} / "
          f"{t['with_drive']['p99'] * 1e3:.1f} ms, without {t['without_drive']['p50'] * 1e3:.1f}"
          f" / {t['without_drive']['p99'] * 1e3:.1f} ms")
    print(f"drive: {r['host_link_bytes'] / 1e9:.2f} GB over the host link, "
          f"{r['nand_bytes'] / 1e9:.2f} GB on NAND; utilization link {u['link']:.1%}, NAND "
          f"channels {u['nand_channels']:.1%}, compute {u['compute']:.1%}")
    if r["host_lag_of"]:  # a daemon's (model mode times in this process: nothing lags)
        print(f"host slower than the modelled drive on {r['host_lag']:,} of "
              f"{r['host_lag_of']:,} commands and kernel calls (on its virtual clock: the "
              f"times above are the model's all the same)")
    if "data" in r:
        d = r["data"]
        print(f"data: {d['blocks_verified']:,} blocks read back and verified, "
              f"{d['data_errors']} wrong, {d['match_mismatches']} match mismatches; "
              f"{d['logical_bytes'] / 1e9:.2f} GB stored ({d['physical_bytes'] / 1e9:.2f} GB "
              f"on media); drive tier {r['capacity_blocks']['drive']:,} blocks, "
              f"{r['evictions']['drive']:,} evicted (the drive had room for "
              f"{d['drive_room_blocks']:,})")
    print(f"hits on KV not computed yet: {r['hits_on_uncomputed_kv']:,} "
          f"({r['uncomputed_hit_fraction']:.1%} of hits, stores at {r['store_when']}); "
          f"stores dropped: {r['stores_dropped']:,}")
    if r["instances"] > 1:
        print(f"{r['instances']} instances, {r['pool']} drives, routed {r['route']}; "
              f"{r['fabric_bytes'] / 1e9:.2f} GB over the fabric")
        for k, q in enumerate(r["per_instance"]):
            print(f"  instance {k}: {q['requests']:,} requests, hit ratio "
                  f"{q['block_hit_ratio']:.3f}, TTFT p50 "
                  f"{q['ttft_s']['with_drive']['p50'] * 1e3:.1f} ms with the drive, "
                  f"{q['ttft_s']['without_drive']['p50'] * 1e3:.1f} ms without")
    for d in r.get("decodes", [r.get("decode") or {}]):
        if d.get("requests"):
            _print_decode(d)
    print(f"{r['wall_seconds']:.1f} s wall, {r['requests_per_s']:,.0f} requests/s, "
          f"{r['blocks_per_s']:,.0f} blocks/s")
    if r["skipped_lines"]:
        print(f"skipped {r['skipped_lines']} bad lines")
    for p in r.get("plots", []):
        print(f"wrote {p}")


COMMANDS = {
    ("replay", None): _cmd_replay,
    ("sweep", None): _cmd_sweep,
    ("bench", "device"): _cmd_bench_device,
    ("bench", "replay"): _cmd_bench_replay,
    ("bench", "queue"): _cmd_bench_queue,
    ("bench", "stack"): _cmd_bench_stack,
    ("bench", "kv"): _cmd_bench_kv,
    ("bench", "hops"): _cmd_bench_hops,
    ("bench", "mlperf-kv"): _cmd_bench_mlperf_kv,
    ("bench", "fairness"): _cmd_bench_fairness,
    ("bench", "keepup"): _cmd_bench_keepup,
    ("bench", "lmcache"): _cmd_bench_lmcache,
    ("serve", None): _cmd_serve,
    ("format", None): _cmd_format,
    ("ctl", "identify"): _cmd_ctl,
    ("ctl", "ns-list"): _cmd_ctl,
    ("ctl", "ns-create"): _cmd_ctl,
    ("ctl", "ns-delete"): _cmd_ctl,
    ("ctl", "log"): _cmd_ctl,
    ("ctl", "fault"): _cmd_ctl,
    ("torture", None): _cmd_torture,
    ("owner-key", None): _cmd_owner_key,
    ("mount", None): _cmd_mount,
    ("fs", "up"): _cmd_fs,
    ("fs", "down"): _cmd_fs,
    ("fs", "crash"): _cmd_fs,
    ("stat", None): _cmd_stat,
    ("bench", "io"): _cmd_bench_io,
    ("bench", "firmware"): _cmd_bench_firmware,
    ("bench", "retrieval"): _cmd_bench_retrieval,
    ("bench", "forward"): _cmd_bench_forward,
    ("eval", None): _cmd_eval,
}


def _client_errors() -> tuple[type[Exception], ...]:
    import hostlib
    from traces.mooncake import TraceError

    return (hostlib.DeviceError, hostlib.ConnectError, hostlib.DeviceGoneError, TraceError)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    key = (args.command, getattr(args, args.command, None))
    try:
        return COMMANDS[key](args)
    except (SsdemuError, ValueError, RuntimeError, OSError, *_client_errors()) as e:
        print(f"ssdemu: error: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("ssdemu: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
