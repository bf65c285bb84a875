"""Exceptions of the client library: one class per status class, raised in one place
(`raise_for_status`)."""

from __future__ import annotations

from ssdemu_wire.layout import STATUS, STATUS_NAMES


class DeviceError(Exception):
    """A command completed with an error status."""

    def __init__(self, status: int, what: str, result: int = 0):
        self.status = status
        self.result = result  # the completion's result field (a value's length, ...)
        self.status_name = STATUS_NAMES.get(status, f"status {status}")
        super().__init__(f"{what}: {self.status_name}")


class InvalidCommandError(DeviceError):
    """Bad opcode or field."""


class NamespaceError(DeviceError):
    """No such namespace."""


class InvalidBufferError(DeviceError):
    """The buffer is not this client's, or the range falls outside it."""


class OutOfRangeError(DeviceError):
    """LBA range past the end of the namespace."""


class MediaError(DeviceError):
    """The media behind the device failed the I/O."""


class CapacityError(DeviceError):
    """No room left on the device."""


class AccessDeniedError(DeviceError):
    """The command acts on what belongs to another owner (a shared namespace it did not
    create: only its creator or an admin deletes it)."""


class KeyNotFoundError(DeviceError):
    """KV: the key does not exist."""


class KeyExistsError(DeviceError):
    """KV: the key exists (store only if it does not)."""


class AbortedError(DeviceError):
    """The drive gave the command up and changed nothing: a requantize whose key was
    changed by another command while it ran (the newer value is kept), a put whose shared
    extent went away meanwhile.  Retrying is safe."""


class KeyPinnedError(InvalidCommandError):
    """KV: a delete of a key that clients pinned (unpin it first, or delete with
    force=True as the namespace's owner or an admin)."""


class RetrievalLimitError(InvalidCommandError):
    """TOPK_PAGES / ATTEND past what one command may ask of the drive (its keys, the summary
    elements it scores, the pages it reads, its result: ssdemu_wire.layout
    RETRIEVAL_MAX_*): split the sequence, or ask for fewer pages."""


class InvalidKeySizeError(InvalidCommandError):
    """KV: keys are 1 to 16 bytes."""


class InvalidValueSizeError(InvalidCommandError):
    """KV: a value is 1 byte to the device's max_value_bytes (identify), and a retrieve needs
    room for the whole value: then `value_length` says how much."""

    def __init__(self, status: int, what: str, result: int = 0):
        super().__init__(status, what, result)
        self.value_length = result
        if result:
            self.args = (f"{self.args[0]} (the value is {result} bytes)",)


class DeviceGoneError(Exception):
    """The daemon shut down or the connection is lost."""


class ConnectError(Exception):
    """The daemon refused the connection or a control request."""


_BY_STATUS = {
    STATUS["INVALID_OPCODE"]: InvalidCommandError,
    STATUS["INVALID_FIELD"]: InvalidCommandError,
    STATUS["INVALID_NAMESPACE"]: NamespaceError,
    STATUS["INVALID_BUFFER"]: InvalidBufferError,
    STATUS["LBA_OUT_OF_RANGE"]: OutOfRangeError,
    STATUS["MEDIA_ERROR"]: MediaError,
    STATUS["ABORTED"]: AbortedError,
    STATUS["CAPACITY_EXCEEDED"]: CapacityError,
    STATUS["ACCESS_DENIED"]: AccessDeniedError,
    STATUS["KV_KEY_NOT_EXIST"]: KeyNotFoundError,
    STATUS["KV_KEY_EXISTS"]: KeyExistsError,
    STATUS["KV_KEY_PINNED"]: KeyPinnedError,
    STATUS["KV_INVALID_KEY_SIZE"]: InvalidKeySizeError,
    STATUS["KV_INVALID_VALUE_SIZE"]: InvalidValueSizeError,
    STATUS["RETRIEVAL_LIMIT"]: RetrievalLimitError,
}


def raise_for_status(status: int, what: str, result: int = 0) -> None:
    if status != STATUS["SUCCESS"]:
        raise _BY_STATUS.get(status, DeviceError)(status, what, result)
