"""`ssdemu serve --metrics HOST:PORT`: the log page's counters as Prometheus metrics at
/metrics (prometheus-client's exposition and HTTP server).  Each scrape reads the log page
afresh; `families(page)` is the pure mapping, tested without HTTP."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (HOST may be empty: every interface) -> (host, port); ValueError with a
    one-line reason otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--metrics takes HOST:PORT (e.g. 127.0.0.1:9464), got {text!r}")
    return host or "0.0.0.0", int(port)


def _histogram(name: str, doc: str, by_class: dict) -> HistogramMetricFamily:
    """The log page's log2 latency buckets (bucket b: [2^b, 2^(b+1)) ns) as a cumulative
    histogram in seconds."""
    h = HistogramMetricFamily(name, doc, labels=["class"])
    for cls, c in by_class.items():
        counts = {int(b): n for b, n in c["latency_histogram_log2_ns"].items()}
        top = max(counts, default=0)
        buckets, total = [], 0
        for b in range(top + 1):
            total += counts.get(b, 0)
            buckets.append((repr(2.0 ** (b + 1) / 1e9), total))
        buckets.append(("+Inf", total))
        h.add_metric([cls], buckets, c["latency_ns_total"] / 1e9)
    return h


def families(page: dict) -> list:
    """Metric families (every name ssdemu_...) for one log page (ssdemu.device.logpage)."""
    out = []
    cls = page["classes"]
    for key, doc in (("commands", "commands completed"), ("errors", "commands that failed"),
                     ("bytes", "bytes moved for clients"),
                     ("bytes_copied", "bytes the daemon copied (bounce path)")):
        f = CounterMetricFamily(f"ssdemu_{key}", doc + ", per command class",
                                labels=["class"])
        for name, c in cls.items():
            f.add_metric([name], c[key])
        out.append(f)
    out.append(_histogram("ssdemu_latency_seconds", "command latency, per class (log2 "
                          "buckets)", cls))
    for key, doc in (("held", "completions held until their modelled time"),
                     ("host_lag", "commands whose media I/O ended after their modelled time"),
                     ("broken_queues", "queues stopped for breaking the ring protocol"),
                     ("faults_injected", "commands failed or delayed by fault injection")):
        out.append(CounterMetricFamily(f"ssdemu_{key}", doc, value=page[key]))
    q = page["quotas"]
    out.append(CounterMetricFamily("ssdemu_quota_waits", "passes that left a uid's "
                                   "commands unfetched: its in-flight quota", value=q["waits"]))
    out.append(GaugeMetricFamily("ssdemu_pins", "pins held", value=page["pins"]))
    for key, doc in (("calls", "kernel calls"), ("ops", "kernel operations charged"),
                     ("bytes", "bytes the kernels touched")):
        f = CounterMetricFamily(f"ssdemu_compute_{key}", doc + ", per kernel",
                                labels=["kernel"])
        for name, k in page["compute"].items():
            f.add_metric([name], k[key])
        out.append(f)
    for key, doc in (("device_ns", "modelled device time"), ("host_ns", "host time")):
        f = CounterMetricFamily(f"ssdemu_compute_{key[:-3]}_seconds", doc + " of the "
                                "kernels, per kernel", labels=["kernel"])
        for name, k in page["compute"].items():
            f.add_metric([name], k[key] / 1e9)
        out.append(f)
    util = page["compute_utilization"]
    out.append(GaugeMetricFamily("ssdemu_compute_utilization", "TOPS budget in use since "
                                 "the drive started (0..1)",
                                 value=util if math.isfinite(util) else 0.0))
    st = page["store"]
    for key, doc in (("logical_bytes", "bytes clients stored"),
                     ("physical_bytes", "bytes the stored values take (shared once)"),
                     ("free_bytes", "free bytes of the data region"),
                     ("keys", "keys in the index"), ("index_keys", "keys the index holds at most"),
                     ("journal_used_blocks", "journal blocks used since the last checkpoint")):
        out.append(GaugeMetricFamily(f"ssdemu_store_{key}", doc, value=st[key]))
    for key, doc in (("checkpoints", "checkpoints written"),
                     ("journal_writes", "journal group commits"),
                     ("journal_records", "journal records"),
                     ("dedup_hits", "puts that shared stored bytes")):
        out.append(CounterMetricFamily(f"ssdemu_store_{key}", doc, value=st[key]))
    model = page["model"]
    for key, doc in (("nand_bytes_read", "bytes the model sensed from NAND"),
                     ("nand_bytes_written", "bytes the model programmed to NAND"),
                     ("link_bytes", "bytes the model moved over the host link")):
        out.append(CounterMetricFamily(f"ssdemu_model_{key}", f"timing model: {doc}",
                                       value=model[key]))
    for key, doc in (("link_busy_ns", "host link busy, device to host"),
                     ("link_in_busy_ns", "host link busy, host to device"),
                     ("channel_busy_ns", "NAND channels "
                     "busy, summed"), ("die_busy_ns", "NAND dies busy, summed")):
        out.append(CounterMetricFamily(f"ssdemu_model_{key[:-3]}_seconds",
                                       f"timing model: {doc}", value=model[key] / 1e9))
    return out


class _Collector:
    def __init__(self, page_fn):
        self.page_fn = page_fn

    def collect(self):
        return iter(families(self.page_fn()))


def serve_metrics(address: str, page_fn):
    """Start the HTTP server (a thread of its own) on HOST:PORT; returns (server, thread)."""
    host, port = parse_address(address)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(page_fn))
    return start_http_server(port, addr=host, registry=registry)
