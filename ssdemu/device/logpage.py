"""Identify and the log page: what the drive is, and its counters (the whole drive's for an
admin and the metrics endpoint, an owner's own commands for anyone else)."""

from __future__ import annotations

from ssdemu.device import _device
from ssdemu.device.sessions import Client
from ssdemu.sim.cost import kernel_stats
from ssdemu_wire.layout import OPCODES, PROTOCOL_VERSION

ffi, lib = _device.ffi, _device.lib
LOG_PAGE_COUNTERS = 1
# the command classes of the data plane's counters, by their SDE_CLASS_* number
# (c/dev/sde_dev.h, the one definition)
CLASS_NAMES = [name for _, name in sorted(
    (getattr(lib, n), n[len("SDE_CLASS_"):].lower()) for n in dir(lib)
    if n.startswith("SDE_CLASS_"))]


class LogPages:
    def __init__(self, daemon):
        self.d = daemon

    def identify(self) -> dict:
        return {
            "model": "ssdemu", "profile": self.d.profile.name,
            "description": self.d.profile.description,
            "capacity_bytes": self.d.store.d_len, "media_bytes": self.d.media.size,
            "logical_block_bytes": self.d.media.lba_size,
            # the KV store's allocation unit: values of whole units move with no copy
            "store_unit_bytes": self.d.store.block,
            "max_io_bytes": lib.SDE_MAX_IO_BYTES, "max_namespaces": lib.SDE_MAX_NS,
            "max_queue_entries": self.d.profile.queue.max_entries,
            "max_key_bytes": lib.SDE_KEY_MAX, "max_value_bytes": self.d.store.max_value,
            "index_keys": self.d.store.index_keys,
            "media": str(self.d.media.spec), "media_path": self.d.media.fio_path,
            "timing": self.d.timing, "clock": self.d.clock, "poll": self.d.poll,
            # how the data plane reaches its media: "inline" (shared memory: the copy in its
            # own thread) or "io_uring" (serve --media-io)
            "media_io": "inline" if lib.sde_dev_media_inline(self.d.dev) else "io_uring",
            "realtime": self.d.realtime,
            "power_cut_emulation": self.d.power_cut,
            "compute_units": self.d.profile.compute.units, "tops": self.d.profile.compute.tops,
            # the retrieval page the profile gives: kv_put_quantized(summary_page=True)
            "page_tokens": self.d.profile.retrieval.page_tokens,
            "protocol_version": PROTOCOL_VERSION,
            "commands": sorted(OPCODES),
        }

    def page(self, page: int, client: Client | None = None) -> dict | None:
        """The counters page: the whole drive's for an admin (and the metrics endpoint);
        for any other client, its owner's own commands only (what others do on a shared
        drive is theirs: docs/threat-model.md)."""
        if page != LOG_PAGE_COUNTERS:
            return None
        if client is not None and not client.admin:
            own = ffi.new("sde_class_stats[9]")
            lib.sde_dev_owner_stats(self.d.dev, client.uid, client.token, own)
            return {"page": page, "scope": "owner", "classes": _class_counters(own),
                    "timing": self.d.timing, "clock": self.d.clock,
                    "quotas": self.d.quotas.as_dict()}
        st = ffi.new("sde_dev_stats *")
        lib.sde_dev_get_stats(self.d.dev, st)
        classes = _class_counters(st.cls)
        budget = ffi.new("sde_budget *")
        lib.sde_dev_budget(self.d.dev, budget)
        compute = {name: {"calls": k.calls, "ops": k.ops, "bytes": k.bytes,
                          "device_ns": k.device_ns, "host_ns": k.host_ns,
                          "host_lag_calls": k.host_lag_calls}
                   for name, k in kernel_stats(budget).items()}
        ms = ffi.new("sde_model_stats *")
        lib.sde_dev_model_stats(self.d.dev, ms)
        model = {name: getattr(ms, name) for name, _ in ffi.typeof("sde_model_stats").fields}
        return {"page": page, "scope": "device", "classes": classes,
                "broken_queues": st.broken_queues,
                "retrieval": self.d.retrieval.stats(),
                "timing": self.d.timing, "clock": self.d.clock, "held": st.held,
                "host_lag": st.host_lag, "model": model,
                "compute": compute,
                "compute_utilization": lib.sde_budget_utilization(budget,
                                                                   self.d.device_now_ns()),
                "compute_busy_until_ns": max(budget.busy_until_ns[0:max(1, budget.units)]),
                "sleeps": st.sleeps, "wakeups": st.wakeups,
                # idle spins given up because the data plane was descheduled mid-spin
                "spin_backoffs": st.spin_backoffs,
                # sleeps at once, not after a spin: a client waited on the data plane's CPU
                "spin_shared_cpu": st.spin_shared_cpu,
                # how late a timed sleep wakes (recent mean): held completions wake so early
                "wake_late_ns": st.wake_late_ns,
                # completion eventfd writes: a client asleep woken (one per batch posted)
                "client_kicks": st.client_kicks,
                # the data plane's scheduler slice asked for (0: the kernel's default)
                "data_plane_slice_ns": st.slice_ns,
                "faults_injected": st.faults_injected, "pins": st.pins,
                # KV changes held back behind an in-flight put of the same key
                "key_waits": st.key_waits,
                # virtual time: commands started at their turn, behind compute commands
                "deferred": st.deferred,
                "power_cut": {"enabled": self.d.power_cut, "cache_destages": st.cache_destages,
                              "undo_failures": st.undo_failures},
                # per uid; waits: passes that left a uid's commands unfetched
                "quotas": {**self.d.quotas.as_dict(), "waits": st.quota_waits,
                           "uid_inflight_peak": st.uid_inflight_peak},
                "logical_bytes": self.d.store.logical_bytes,
                "physical_bytes": self.d.store.physical_bytes,
                "store": self.d.store.info()}


def _class_counters(cls) -> dict:
    """The per-class counters of the log page, from sde_class_stats[9] (CLASS_NAMES' order)."""
    out = {}
    for i, name in enumerate(CLASS_NAMES):
        c = cls[i]
        out[name] = {
            "commands": c.commands, "errors": c.errors, "bytes": c.bytes,
            "bytes_copied": c.bytes_copied,
            "mean_latency_ns": c.lat_ns_total / c.commands if c.commands else 0.0,
            "latency_ns_total": c.lat_ns_total,
            # bucket b holds latencies in [2^b, 2^(b+1)) ns
            "latency_histogram_log2_ns": {str(b): c.lat_hist[b] for b in range(64)
                                          if c.lat_hist[b]},
        }
    return out
