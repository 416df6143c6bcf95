"""User exits named in the config ("module:function"), resolved once at start.

IMS calls its exits (the overflow exit, DFSQSPC0) by load-module name; ours are
Python callables. A name that does not import or is not callable is a config
error at start, not a surprise at the first overflow.
"""

import importlib
from collections.abc import Callable

from .config import ConfigError


def resolve(ref: str, key: str) -> Callable | None:
    """The callable ``ref`` names, None for ""; raises ConfigError naming ``key``."""
    if not ref:
        return None
    module_name, _, attribute = ref.partition(":")
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except Exception as err:  # any failure to import is the operator's to fix
        raise ConfigError([f"{key}: cannot load {ref!r}: {type(err).__name__}: {err}"]) from None
    if not callable(target):
        raise ConfigError([f"{key}: {ref!r} is not callable"])
    return target
