"""The blocking and the async SDK have the same names (docs/sdk.md): every public
method of ``cqsclient.client`` has its ``cqsclient.aio`` counterpart with the same
parameters (names, kinds, defaults, annotations up to async), and the other way
round; the async one is awaited exactly where the blocking one does I/O."""

from __future__ import annotations

import inspect
import re

import anyio
import pytest

import cqsclient.aio as aio
import cqsclient.client as blocking

CLASSES = ["Client", "StructureHandle", "UnitOfWork", "Consumer", "Delivery"]
# The one difference in names: each client's own context-manager and iterator protocols.
PROTOCOL = {"__enter__": "__aenter__", "__exit__": "__aexit__",
            "__iter__": "__aiter__", "__next__": "__anext__"}
# Methods that do no I/O, so they are plain methods in the async client too:
# a unit of work's put, delete, move and unlock only gather ops for its one
# commit (cqsclient/unitofwork.py); unit_of_work only makes the context
# manager; browse_all, notifications and consume return async iterators, made
# without waiting for anything; holds looks in the client's lock book; a
# consumer's stop only sets a flag (and wakes the read); iterators return
# themselves.
NOT_AWAITED = {
    ("Client", "notifications"), ("Client", "holds"), ("StructureHandle", "browse_all"),
    ("StructureHandle", "unit_of_work"), ("StructureHandle", "consume"), ("UnitOfWork", "put"),
    ("UnitOfWork", "delete"), ("UnitOfWork", "move"), ("UnitOfWork", "unlock"),
    ("Consumer", "stop"), ("Consumer", "__iter__"),
}
# Deliberate differences in parameters, each with its reason.
DIFFERENT = {
    ("Client", "__init__"): "made by connect(), not by users: the blocking connect() "
    "connects and registers first and hands the Client its connection; the async "
    "Client connects when it is entered, so it keeps connect()'s arguments",
}


def members(cls: type) -> dict[str, object]:
    """Public methods and properties, with __init__ and the context-manager and
    iterator protocols (a Delivery's message fields are data, not members)."""
    wanted = {"__init__", *PROTOCOL, *PROTOCOL.values()}
    found = {n: inspect.getattr_static(cls, n) for n in dir(cls)
             if not n.startswith("_") or (n in wanted and n in vars(cls))}
    return {n: m for n, m in found.items() if callable(m) or isinstance(m, property)}


def counterpart(name: str) -> str:
    return PROTOCOL.get(name, name)


def shape(annotation: object) -> str:
    """An annotation as written, with the async spelling of a type made plain."""
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    text = re.sub(r"\bAsync(Iterator|Iterable|Generator)\b", r"\1", text)
    return re.sub(r"\bAwaitable\[(.*)\]", r"\1", text)


def parameters(fn) -> tuple:
    sig = inspect.signature(fn)
    return ([(p.name, p.kind, p.default, shape(p.annotation)) for p in sig.parameters.values()],
            shape(sig.return_annotation))


def pairs(keep) -> list:
    """(class, name, blocking member, async member) of each member ``keep`` takes."""
    found = []
    for cls in CLASSES:
        b, a = members(getattr(blocking, cls)), members(getattr(aio, cls))
        for name in sorted(b):
            if keep(cls, name, b[name]):
                found.append(pytest.param(cls, name, b[name], a.get(counterpart(name)),
                                          id=f"{cls}.{name}"))
    return found


def test_both_modules_export_the_same_names():
    """cqsclient.client and cqsclient.aio export the same public names."""
    assert sorted(blocking.__all__) == sorted(aio.__all__)


def test_connect_takes_the_same_arguments():
    """connect() has the same parameters, defaults and annotations in both."""
    assert parameters(blocking.connect) == parameters(aio.connect)


@pytest.mark.parametrize("cls", CLASSES)
def test_every_method_has_its_counterpart_both_ways(cls):
    """No public method or property is in one client only."""
    b, a = members(getattr(blocking, cls)), members(getattr(aio, cls))
    assert sorted(counterpart(n) for n in b) == sorted(a)


@pytest.mark.parametrize(("cls", "name", "mine", "theirs"),
                         pairs(lambda cls, name, member: (cls, name) not in DIFFERENT))
def test_a_method_takes_the_same_parameters_in_both(cls, name, mine, theirs):
    """Same parameter names, kinds, defaults and annotations (up to async), and
    a property in one is a property in the other."""
    assert isinstance(mine, property) == isinstance(theirs, property)
    if not isinstance(mine, property):
        assert parameters(mine) == parameters(theirs)


@pytest.mark.parametrize(("cls", "name", "mine", "theirs"), pairs(
    lambda cls, name, member: name != "__init__" and not isinstance(member, property)))
def test_the_async_client_awaits_what_blocks(cls, name, mine, theirs):
    """A blocking method that does I/O is a coroutine in the async client; one
    that does none is a plain method in both."""
    assert not inspect.iscoroutinefunction(mine)
    awaited = (cls, name) not in NOT_AWAITED
    assert inspect.iscoroutinefunction(theirs) == awaited


def test_the_deliberate_differences_are_still_there():
    """Each listed difference exists (else it should leave the list)."""
    for cls, name in DIFFERENT:
        mine, theirs = (inspect.getattr_static(getattr(m, cls), name) for m in (blocking, aio))
        assert parameters(mine) != parameters(theirs)


def test_the_objects_carry_the_same_attributes(server, address):
    """A client, a structure handle and a unit of work have the same public
    attributes in both SDKs once connected."""
    def public(obj):
        return sorted(n for n in vars(obj) if not n.startswith("_"))

    with blocking.connect(address, client="B1") as c:
        s = c.structure("MSGQ01")
        mine = [public(c), public(s), public(s.unit_of_work())]

    async def main():
        async with aio.connect(address, client="A1") as c:
            s = await c.structure("MSGQ01")
            return [public(c), public(s), public(s.unit_of_work())]

    assert anyio.run(main) == mine
