"""The drive's firmware: Numba kernels, cached on disk (firmware/warm.py fills the cache).

A process that cannot write firmware/__pycache__ (a daemon run by another user than the one
who built the tree, or a tree on a read-only mount) compiles into a cache of its own, seeded
with the tree's cached code: Numba would otherwise fall back to ~/.cache/numba and compile
everything again there (minutes, at the daemon's start), or fail with "cannot cache function"
when the user has no writable home either.
"""

import os
import pathlib
import stat
import tempfile

_HERE = pathlib.Path(__file__).resolve().parent


def _writable(path: pathlib.Path) -> bool:
    return os.access(path if path.is_dir() else path.parent, os.W_OK | os.X_OK)


def private_cache_dir() -> pathlib.Path:
    """This user's own cache directory: under $XDG_CACHE_HOME (or ~/.cache) when that can be
    written, else a directory of its own in the temp dir, which must be this user's and
    closed to others (anyone could have made it first, with code in it for us to run)."""
    home = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"))
    try:
        (home / "ssdemu").mkdir(parents=True, exist_ok=True)
        if _writable(home / "ssdemu"):
            return home / "ssdemu" / "numba"
    except OSError:
        pass
    path = pathlib.Path(tempfile.gettempdir()) / f"ssdemu-numba-{os.getuid()}"
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid()
            or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        raise RuntimeError(f"{path} is not a directory of this user's alone: the firmware's "
                           f"compiled code cannot be cached there (set NUMBA_CACHE_DIR)")
    return path


def _use_private_cache() -> None:
    if os.environ.get("NUMBA_CACHE_DIR") or _writable(_HERE / "__pycache__"):
        return
    from numba.core import caching, config

    from firmware.cachefiles import merge_functions

    config.CACHE_DIR = str(private_cache_dir())
    # where Numba's locator for a user-provided cache directory puts this folder's files
    dest = pathlib.Path(config.CACHE_DIR) / caching.UserProvidedCacheLocator \
        .get_suitable_cache_subpath(str(_HERE / "entry.py"))
    dest.mkdir(parents=True, exist_ok=True)
    # an index records its source file's stamp, which is the same file here: valid as it is
    merge_functions([_HERE / "__pycache__"], dest, move=False)


_use_private_cache()
