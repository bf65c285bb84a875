"""Block I/O: the NVM command set's reads, writes, flush, write zeroes and deallocate; a
mixin of hostlib.Device (each command defined once, as X_async: hostlib/commands.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hostlib.commands import command
from hostlib.staging import Staging
from ssdemu_wire.layout import OPCODES

if TYPE_CHECKING:
    from hostlib.client import Future, QueuePair


class BlockCommands(Staging):
    @command()
    def read_async(self, nsid: int, lba: int, out: np.ndarray,
                   qp: QueuePair | None = None) -> Future:
        qp = qp or self.qp
        fields, bounced, copy, release = self._staged_out(out, qp)
        return self.submit(OPCODES["READ"], ("read ns {} lba {}", nsid, lba), qp=qp,
                           bounce=bounced, after=(lambda _: copy(out.nbytes)) if copy else None,
                           release=release, nsid=nsid, lba=lba, **fields)

    @command()
    def write_async(self, nsid: int, lba: int, data: np.ndarray,
                    qp: QueuePair | None = None) -> Future:
        qp = qp or self.qp
        fields, bounced, release = self._staged_in(data, qp)
        return self.submit(OPCODES["WRITE"], ("write ns {} lba {}", nsid, lba), qp=qp,
                           bounce=bounced, release=release, nsid=nsid, lba=lba, **fields)

    @command()
    def flush_async(self, nsid: int = 0, qp: QueuePair | None = None) -> Future:
        return self.submit(OPCODES["FLUSH"], f"flush ns {nsid}", qp=qp, nsid=nsid)

    @command()
    def write_zeroes_async(self, nsid: int, lba: int, nbytes: int,
                           qp: QueuePair | None = None) -> Future:
        return self.submit(OPCODES["WRITE_ZEROES"], "write zeroes", qp=qp, nsid=nsid, lba=lba,
                           length=nbytes)

    @command()
    def deallocate_async(self, nsid: int, lba: int, nbytes: int,
                         qp: QueuePair | None = None) -> Future:
        return self.submit(OPCODES["DEALLOCATE"], "deallocate", qp=qp, nsid=nsid, lba=lba,
                           length=nbytes)
