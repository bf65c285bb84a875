"""The data plane's opcode table (c/dev/dev_ops.c), walked row by row: every opcode of the
wire format has a row, every row the handlers its kind needs, and the rows say what the data
plane does (the class counted, where it runs, which fault rules apply, whether it waits its
turn on the virtual clock, whether it needs the store, whether it names a key)."""

from ssdemu.device._device import ffi, lib

from ssdemu.device.admin import HANDLERS
from ssdemu_wire.layout import OPCODES

# the three compute commands whose kernels run on the firmware's threads
FIRMWARE_KERNELS = {"KV_STORE_QUANTIZED", "KV_RETRIEVE_DEQUANTIZED", "PREFIX_MATCH_TOKENS",
                    "KV_REQUANTIZE"}
READS = {"READ", "KV_RETRIEVE", "KV_RETRIEVE_DEQUANTIZED"}
WRITES = {"WRITE", "KV_STORE", "KV_STORE_QUANTIZED", "KV_REQUANTIZE"}
# the commands whose SQE names a key (lba, key_hi) that the index looks up as they start: a
# fetched batch's lookups are prefetched together (dev_kv_prefetch), theirs and no others
KEYED = {"KV_STORE", "KV_RETRIEVE", "KV_DELETE", "KV_EXIST", "KV_STORE_QUANTIZED",
         "KV_RETRIEVE_DEQUANTIZED", "KV_REQUANTIZE"}


def row(op: int):
    info = ffi.new("sde_opcode_info *")
    if lib.sde_dev_opcode_info(op, info) < 0:
        return None
    return info


def test_every_wire_opcode_has_its_row():
    assert len(OPCODES) == lib.SDE_CMD_COUNT  # the C table's count check counts these
    for name, op in OPCODES.items():
        r = row(op)
        assert r is not None, name
        assert r.op == op and ffi.string(r.name).decode() == name
        assert r.cls != lib.SDE_CLASS_INVALID, name
        assert r.where in (lib.SDE_RUN_DATA_PLANE, lib.SDE_RUN_HOST), name
        assert r.has_start, name  # every row starts its command: no switch elsewhere
        # host commands have a Python handler; data-plane ones have none (one dispatch)
        assert (op in HANDLERS) == (r.where == lib.SDE_RUN_HOST), name


def test_no_row_without_an_opcode():
    rows = [op for op in range(256) if row(op) is not None]
    assert sorted(rows) == sorted(OPCODES.values())
    gap = min(set(range(256)) - set(OPCODES.values()))
    assert lib.sde_dev_opcode_class(gap) == lib.SDE_CLASS_INVALID  # a gap in the table
    assert lib.sde_dev_opcode_class(255) == lib.SDE_CLASS_INVALID
    assert set(HANDLERS) <= set(OPCODES.values())


def test_the_rows_say_what_the_data_plane_does():
    for name, op in OPCODES.items():
        r = row(op)
        # a kernel on the firmware's threads: its row says what follows it
        assert bool(r.has_kernel_done) == (name in FIRMWARE_KERNELS), name
        # those join the virtual clock's FIFO of compute commands themselves; every other
        # data-plane command waits its turn behind them (COUNTERS, untimed, for that: it
        # reads the books at its turn); admin commands are not timed
        assert bool(r.in_turn) == (name not in FIRMWARE_KERNELS and r.where != lib.SDE_RUN_HOST)
        expect = (lib.SDE_FAULT_DIR_READ if name in READS else
                  lib.SDE_FAULT_DIR_WRITE if name in WRITES else 0)
        assert r.fault_dir == expect, name
        assert bool(r.needs_store) == (r.cls == lib.SDE_CLASS_KV or name in ("PIN", "UNPIN")), name
        assert bool(r.keyed) == (name in KEYED), name
        assert lib.sde_dev_opcode_class(op) == r.cls
        assert lib.sde_dev_opcode_where(op) == r.where
