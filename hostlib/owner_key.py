"""Owner keys (the format and files are the wire's: ssdemu_wire/owner_key.py, which the
daemon reads too): `new(path)` writes one, `load(path)` reads one, `resolve` picks what a
client presents."""

from ssdemu_wire.owner_key import ENV, OwnerKeyError, check, load, new, resolve

__all__ = ["ENV", "OwnerKeyError", "check", "load", "new", "resolve"]
