"""Structure definitions: the config seeds the repository, which wins after that."""

import structlog

from cqsd.config import loads
from cqsd.server.definitions import Definition, Definitions, Held
from cqsd.storage import repository

KiB = 1024
TOML = """
[[structure]]
name = "P"
size = "{size}"
initsize = "64KiB"
overflow = "POV"

[[structure]]
name = "POV"
size = "64KiB"
"""


def config(size="128KiB"):
    return loads(TOML.format(size=size))


def test_the_first_start_seeds_the_repository_from_the_config(tmp_path):
    """A repository that holds nothing of a structure takes the config's definition,
    its current size the INITSIZE; nothing is pending."""
    db = tmp_path / "repository.db"
    definitions = Definitions(config(), db)
    definitions.load()
    rows = repository.structures(db)
    assert {n: (r["size"], r["initsize"], r["current_size"], r["changed_by"])
            for n, r in rows.items()} == {"P": (128 * KiB, 64 * KiB, 64 * KiB, "config"),
                                          "POV": (64 * KiB, 64 * KiB, 64 * KiB, "config")}
    assert definitions.describe("P") == {"definition": "config", "pending": None}


def test_the_repository_wins_and_a_config_that_disagrees_is_reported(tmp_path):
    """What an operator changed comes back at the next start; a config changed since is
    named in a structure_config_differs event and shown as pending, not applied."""
    db = tmp_path / "repository.db"
    first = Definitions(config(), db)
    first.load()
    first.resized("P", 96 * KiB, "operator")
    first.failed("POV", True)
    second = Definitions(config(size="256KiB"), db)
    with structlog.testing.capture_logs() as logged:
        second.load()
    assert second.held["P"] == Held(Definition(128 * KiB, 64 * KiB), 96 * KiB)
    assert second.held["POV"].failed is True
    assert second.describe("P") == {"definition": "repository", "pending": {"size": 256 * KiB}}
    [differs] = [e for e in logged if e["event"] == "structure_config_differs"]
    assert (differs["config"], differs["repository"], differs["changed_by"]) == (
        {"size": 256 * KiB}, {"size": 128 * KiB}, "operator")
    alone = Definitions(loads('[[structure]]\nname = "Q"\nsize = "1MiB"\n'), db)
    with structlog.testing.capture_logs() as logged:
        alone.load()
    assert [(e["event"], e["structure"]) for e in logged if e["log_level"] == "warning"] == [
        ("structure_not_configured", "P"), ("structure_not_configured", "POV")]


def test_a_repository_that_cannot_be_written_leaves_the_change_in_force(tmp_path):
    """A failed write is an error event; the daemon carries on with the new size."""
    db = tmp_path / "repository.db"
    definitions = Definitions(config(), db)
    definitions.load()
    db.unlink()
    db.mkdir()  # no longer a database SQLite can open
    with structlog.testing.capture_logs() as logged:
        definitions.resized("P", 100 * KiB, "put does not fit")
    assert definitions.held["P"].current_size == 100 * KiB
    assert [e["event"] for e in logged] == ["structure_definition_not_saved"]


def test_without_a_repository_the_config_is_all_there_is():
    """In-process, with no data directory: the config's definitions, nothing written."""
    definitions = Definitions(config())
    definitions.load()
    definitions.resized("P", 80 * KiB, "operator")
    assert definitions.held["P"] == Held(Definition(128 * KiB, 64 * KiB), 80 * KiB)
