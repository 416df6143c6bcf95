"""The SDK's secret from the environment: $CQSD_SECRET, else $CQSD_SECRET_FILE's first
line; connect() uses it when no secret is passed."""

import pytest

from cqsclient.credentials import read_secret_file, secret_from_env


def test_the_variable_then_the_file(tmp_path):
    path = tmp_path / "secret"
    path.write_text("from-file\r\nsecond line\n")
    assert secret_from_env({}) is None
    assert secret_from_env({"CQSD_SECRET_FILE": str(path)}) == "from-file"
    assert secret_from_env({"CQSD_SECRET": "", "CQSD_SECRET_FILE": str(path)}) == ""
    assert secret_from_env({"CQSD_SECRET": "s", "CQSD_SECRET_FILE": str(path)}) == "s"


def test_a_file_that_cannot_be_read_is_named(tmp_path):
    with pytest.raises(ValueError, match="secret file .*missing"):
        read_secret_file(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="missing"):
        secret_from_env({"CQSD_SECRET_FILE": str(tmp_path / "missing")})
