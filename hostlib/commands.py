"""The queue commands' one definition, and the two APIs made from it.

A family module (hostlib/blockio.py, kv.py, retrieval.py, admin.py) defines each command
once, as `X_async`: it builds the command, submits it and returns its Future.  `@command`
marks it, with what the call returns (`finish`, from the Future's result) and what a
failure becomes (`on_error`).  From that one definition, `blocking` gives hostlib.Device its
`X` (the Future waited for) and `awaited` gives hostlib.aio.AsyncDevice its `X` (the Future
awaited on the event loop): a command a family gains reaches both APIs, and
tests/test_aio.py holds the two command sets equal.  Control-plane requests (faults,
removal, power cuts) are not queue commands: CONTROL names those AsyncDevice runs in place.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# what AsyncDevice runs in place (short control-socket requests, not queue commands)
CONTROL = ("inject_fault", "clear_faults", "faults", "surprise_removal", "power_cut")


@dataclass(frozen=True)
class Spec:
    name: str  # the call's name: X (X_async submits)
    finish: Callable | None  # (result, arguments) -> what X returns; None: the result
    on_error: Callable | None  # (exception, arguments) -> Retry, Value or None (raise it)


@dataclass(frozen=True)
class Retry:
    """Submit the command again with these arguments; X returns then(its result)."""
    arguments: dict
    then: Callable[[Any], Any]


@dataclass(frozen=True)
class Value:
    """X returns this instead of raising."""
    value: Any


def command(finish: Callable | None = None, on_error: Callable | None = None):
    """Marks a family's X_async as a queue command (see the module doc)."""
    def mark(fn):
        if not fn.__name__.endswith("_async"):
            raise TypeError(f"a command is defined as X_async, not {fn.__name__}")
        fn.command = Spec(fn.__name__[:-len("_async")], finish, on_error)
        return fn
    return mark


def specs(cls) -> dict[str, Spec]:
    """The queue commands of a Device class, by name."""
    return {s.name: s for s in (getattr(getattr(cls, n), "command", None) for n in dir(cls))
            if isinstance(s, Spec)}


class _Arguments:
    """A call's arguments by name, bound only when a finish or a recovery reads one (binding
    costs microseconds, and most calls' finish reads none)."""

    __slots__ = ("_fn", "_args", "_kwargs", "_bound")

    def __init__(self, fn, args, kwargs):
        self._fn, self._args, self._kwargs, self._bound = fn, args, kwargs, None

    def __getitem__(self, name: str):
        if self._bound is None:
            self._bound = _arguments(self._fn, self._args, self._kwargs)
        return self._bound[name]


def _arguments(fn, args, kwargs) -> dict:
    """The call's arguments by name, defaults filled in (only on finish's and on_error's
    paths: binding costs microseconds a call)."""
    bound = inspect.signature(fn).bind(None, *args, **kwargs)
    bound.apply_defaults()
    out = dict(bound.arguments)
    out.pop(next(iter(out)))  # the instance
    out.update(out.pop("kw", {}))
    return out


def _recovery(spec: Spec, fn, error: Exception, args, kwargs):
    """What a failed command becomes (Value or Retry), or its error raised again."""
    what = spec.on_error(error, _arguments(fn, args, kwargs)) if spec.on_error else None
    if what is None:
        raise error
    return what


def blocking(spec: Spec, fn):
    """Device.X: X_async's Future waited for."""
    if spec.finish is None and spec.on_error is None:
        def call(self, *args, **kwargs):
            return fn(self, *args, **kwargs).result()
    else:
        def call(self, *args, **kwargs):
            try:
                result = fn(self, *args, **kwargs).result()
            except Exception as e:
                what = _recovery(spec, fn, e, args, kwargs)
                if isinstance(what, Value):
                    return what.value
                return what.then(fn(self, **what.arguments).result())
            return spec.finish(result, _Arguments(fn, args, kwargs)) if spec.finish else result
    return _named(call, spec, fn, "waits for its completion")


def awaited(spec: Spec, fn):
    """AsyncDevice.X: X_async's Future awaited, on the AsyncDevice's queue pair."""
    takes_qp = "qp" in inspect.signature(fn).parameters

    async def call(self, *args, **kwargs):
        if takes_qp:
            kwargs.setdefault("qp", self.qp)
        try:
            result = await self._await(fn(self.dev, *args, **kwargs))
        except Exception as e:
            what = _recovery(spec, fn, e, args, kwargs)
            if isinstance(what, Value):
                return what.value
            return what.then(await self._await(fn(self.dev, **what.arguments)))
        return spec.finish(result, _Arguments(fn, args, kwargs)) if spec.finish else result
    return _named(call, spec, fn, "awaited on the event loop")


def _named(call, spec: Spec, fn, how: str):
    functools.update_wrapper(call, fn)
    call.__name__ = call.__qualname__ = spec.name
    call.__doc__ = f"{spec.name}_async's command, {how}." + (
        f"\n\n{inspect.cleandoc(fn.__doc__)}" if fn.__doc__ else "")
    del call.command  # (copied by update_wrapper) the call is not a definition itself
    return call


def derive_blocking(cls):
    """Class decorator: Device gets X for every X_async command it has."""
    for name, spec in specs(cls).items():
        if name in vars(cls):
            raise TypeError(f"{cls.__name__}.{name} is written by hand: define only "
                            f"{name}_async")
        setattr(cls, name, blocking(spec, getattr(cls, name + "_async")))
    return cls


def derive_awaited(cls, device_cls):
    """AsyncDevice gets X for every command of device_cls, and the CONTROL requests."""
    for name, spec in specs(device_cls).items():
        setattr(cls, name, awaited(spec, getattr(device_cls, name + "_async")))
    for name in CONTROL:
        setattr(cls, name, _in_place(name, getattr(device_cls, name)))
    return cls


def _in_place(name: str, fn):
    async def call(self, *args, **kwargs):
        return fn(self.dev, *args, **kwargs)
    functools.update_wrapper(call, fn)
    return call
