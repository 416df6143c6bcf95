"""What users and type checkers import from cqsclient: py.typed, __version__,
the Literal queue types and the public names."""

from __future__ import annotations

import importlib.metadata
import tomllib
import typing
from pathlib import Path

import cqsclient
import cqsclient.aio
from cqsd.engine import QueueType


def test_the_queue_type_literal_names_every_queue_type_in_number_order():
    """QueueTypeName lists the queue types of docs/protocol.md, as the daemon numbers them."""
    assert typing.get_args(cqsclient.QueueTypeName) == tuple(t.name for t in QueueType)


def test_the_package_ships_py_typed_and_says_its_version():
    """py.typed is in the package and in its package data; __version__ is the
    distribution's version."""
    package = Path(cqsclient.__file__).parent
    assert (package / "py.typed").is_file()
    setuptools = tomllib.loads((package.parent / "pyproject.toml").read_text())["tool"]
    assert "py.typed" in setuptools["setuptools"]["package-data"]["cqsclient"]
    assert cqsclient.__version__ == importlib.metadata.version("cqsclient")


def test_every_public_name_is_there():
    """Every name in __all__ resolves, in cqsclient and in cqsclient.aio."""
    for module in (cqsclient, cqsclient.aio):
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"
