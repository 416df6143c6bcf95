"""What the operator's documents say matches what the daemon does."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_smds_is_described_as_part_of_the_daemon():
    """SMDS runs in the daemon (cqsd/server/datasets.py): no document says otherwise."""
    for doc in ("README.md", "docs/operations.md"):
        text = " ".join((ROOT / doc).read_text().split())
        assert "not yet wired" not in text and "will join these families" not in text, doc
