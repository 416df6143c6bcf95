"""The README's layout and docs/architecture.md name every module of the daemon,
so that neither goes stale when a room is added or moved."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "cqsd" / "server"


def server_modules() -> set[str]:
    """The daemon's modules, as the docs name them (``smds/`` once for the subpackage)."""
    return {p.name for p in SERVER.glob("*.py") if p.name != "__init__.py"} | {"smds/"}


def test_the_readme_layout_names_every_server_module():
    """Each module of cqsd/server/ is named in the README's Layout section."""
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    named = set(re.findall(r"`([\w/]+(?:\.py|/))`", layout))
    assert server_modules() <= named


def test_the_architecture_page_names_every_server_module():
    """docs/architecture.md places each module of cqsd/server/ and cqsd/server/smds/."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    smds = {p.name for p in (SERVER / "smds").glob("*.py") if p.name != "__init__.py"}
    missing = {m for m in server_modules() | smds if m.removesuffix(".py") not in page}
    assert not missing
