"""hostlib: the client library offload experiments import."""

from hostlib.attention import merge_attention
from hostlib.client import Device, Future, QueuePair, connect, control_request, reinsert
from hostlib.errors import (
    CapacityError,
    ConnectError,
    DeviceError,
    DeviceGoneError,
    InvalidBufferError,
    InvalidCommandError,
    InvalidKeySizeError,
    InvalidValueSizeError,
    KeyExistsError,
    KeyNotFoundError,
    MediaError,
    NamespaceError,
    OutOfRangeError,
)

__all__ = [
    "CapacityError", "ConnectError", "Device", "DeviceError", "DeviceGoneError", "Future",
    "InvalidBufferError", "InvalidCommandError", "InvalidKeySizeError",
    "InvalidValueSizeError", "KeyExistsError", "KeyNotFoundError", "MediaError",
    "NamespaceError", "OutOfRangeError", "QueuePair", "connect", "control_request",
    "merge_attention", "reinsert",
]
