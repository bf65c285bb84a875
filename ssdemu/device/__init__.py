"""The device: what `ssdemu serve` runs.  The daemon and its control plane, admin commands,
the store, media, the io_uring engine's Python face, fault rules, metrics; its C module
(`_device`: engine, data plane, store, firmware entry, timing model) is built from c/ by
c/cffi_build.py.  Imports the wire format, the firmware and the timing model; never the
client library or the tools."""
