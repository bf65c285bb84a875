"""The wire format both sides of the drive speak, and nothing else: the queue-pair layout and
its ring functions (C, c/wire/sde_queue.h and c/wire/sde_ring.c, built by cffi as
ssdemu_wire._ring), opcodes and status codes, the control plane's messages, key and request
packing, dtype codes.

Layers: ssdemu_wire at the bottom imports neither side; the device (ssdemu serve: daemon,
store, firmware, timing) and the client (hostlib) each import it and never each other; the
tools that use both (the CLI front door, replay, bench, torture) sit above them.
tests/test_layers.py checks it on the import graph."""
