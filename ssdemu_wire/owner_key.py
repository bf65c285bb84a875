"""Owner keys: an owner on the drive is a secret, not a name.

A key is 32 random bytes, written as one line of hex in a file only its user can read (mode
0600, like an ssh private key).  A client that presents it at connect owns what was created
with it (namespaces, their keys and fault rules), across reconnects and daemon restarts; the
daemon keeps only a 64-bit digest of it, on the media with the namespaces.  Knowing an
experiment's name gives nothing; reading its key file does, so the file's place and mode
decide who shares an owner (see docs/architecture.md, Threat model).

    ssdemu owner-key ~/.config/ssdemu/exp-a.key      # once
    hostlib.connect(sock, owner_key_file="~/.config/ssdemu/exp-a.key")
    SSDEMU_OWNER_KEY_FILE=~/.config/ssdemu/exp-a.key python experiment.py
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat

ENV = "SSDEMU_OWNER_KEY_FILE"
KEY_BYTES = 32
MIN_BYTES, MAX_BYTES = 16, 64  # what the daemon accepts (a key written elsewhere)


class OwnerKeyError(ValueError):
    """A key file that cannot be used; the message says why, in one line."""


def new(path: str) -> str:
    """Write a fresh key to path (which must not exist; its directory is made 0700 if
    missing) with mode 0600; returns the key (hex)."""
    path = os.path.expanduser(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, mode=0o700, exist_ok=True)
    key = secrets.token_hex(KEY_BYTES)
    try:
        # O_EXCL|O_NOFOLLOW: never through a link planted at the path, never over a key
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise OwnerKeyError(f"{path} exists: an owner key is never overwritten (its "
                            "namespaces would be lost to it)") from None
    except OSError as e:
        raise OwnerKeyError(f"cannot create {path}: {e.strerror}") from None
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key


def check(key: str | bytes) -> str:
    """A key given directly (hex text or raw bytes), checked; returns it as hex."""
    if isinstance(key, (bytes, bytearray)):
        raw = bytes(key)
    else:
        try:
            raw = bytes.fromhex(str(key).strip())
        except ValueError:
            raise OwnerKeyError("an owner key is hex text") from None
    if not MIN_BYTES <= len(raw) <= MAX_BYTES:
        raise OwnerKeyError(f"an owner key is {MIN_BYTES} to {MAX_BYTES} bytes, got "
                            f"{len(raw)}")
    return raw.hex()


def load(path: str) -> str:
    """The key in path (hex).  Refused if anyone but its user could read or change it."""
    path = os.path.expanduser(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise OwnerKeyError(f"cannot read owner key {path}: {e.strerror}") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OwnerKeyError(f"owner key {path} is not a regular file")
        if st.st_uid != os.getuid():
            raise OwnerKeyError(f"owner key {path} belongs to uid {st.st_uid}, not to this "
                                f"user ({os.getuid()})")
        if st.st_mode & 0o077:
            raise OwnerKeyError(f"owner key {path} is open to others (mode "
                                f"{stat.S_IMODE(st.st_mode):04o}): chmod 600 it")
        text = f.read(4 * MAX_BYTES)
    try:
        return check(text)
    except OwnerKeyError as e:
        raise OwnerKeyError(f"owner key {path}: {e}") from None


def resolve(owner_key: str | bytes | None, owner_key_file: str | None) -> str | None:
    """The key a client presents: the one given, else the one in the file given, else the
    file named by $SSDEMU_OWNER_KEY_FILE; None: no owner key (the uid alone owns)."""
    if owner_key is not None and owner_key_file is not None:
        raise OwnerKeyError("give owner_key or owner_key_file, not both")
    if owner_key is not None:
        return check(owner_key)
    path = owner_key_file if owner_key_file is not None else os.environ.get(ENV) or None
    return load(path) if path is not None else None


def token(key: str) -> int:
    """The 64-bit digest of a (checked, hex) key that the daemon keeps with an owner's
    namespaces: a keyed-hash personalization, so that it is no digest of anything else."""
    digest = hashlib.blake2b(bytes.fromhex(key), digest_size=8,
                             person=b"ssdemu-owner").digest()
    return int.from_bytes(digest, "little") or 1  # 0 means no owner key
