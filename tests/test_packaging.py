"""The wheel ships every package of the source tree (an editable install would hide a gap)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_listed_in_pyproject():
    """Each directory with an __init__.py under cqsd/ and logstream/ is a listed package."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for top in ("cqsd", "logstream")
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert found <= listed, f"not shipped: {sorted(found - listed)}"
    assert "cqsclient" in listed
