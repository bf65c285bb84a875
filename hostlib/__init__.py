"""hostlib: the client library offload experiments import."""

from hostlib import owner_key
from hostlib.attention import merge_attention
from hostlib.client import Device, Future, QueuePair, connect, control_request, reinsert
from hostlib.errors import (
    AbortedError,
    AccessDeniedError,
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
    KeyPinnedError,
    MediaError,
    NamespaceError,
    OutOfRangeError,
    RetrievalLimitError,
)

__all__ = [
    "AbortedError", "AccessDeniedError", "CapacityError", "ConnectError", "Device", "DeviceError",
    "DeviceGoneError", "Future",
    "InvalidBufferError", "InvalidCommandError", "InvalidKeySizeError",
    "InvalidValueSizeError", "KeyExistsError", "KeyNotFoundError", "KeyPinnedError", "MediaError",
    "NamespaceError", "OutOfRangeError", "QueuePair", "RetrievalLimitError", "connect",
    "control_request", "merge_attention", "owner_key", "reinsert",
]
