"""Where cqsctl looks for its daemon when no address is given: the profile, the
daemon's config, the service layout, the default; and what it says when none answers."""

import subprocess
import sys

import pytest

from cqsclient.profile import (
    SERVICE_SOCKET,
    Candidate,
    Profile,
    candidates,
    profile_path,
    read_profile,
    unreachable,
)


def addresses(found):
    return [c.address for c in found]


def test_an_address_given_outright_is_the_only_one_tried(tmp_path):
    profile = Profile(path="p", address="unix:///p.sock")
    assert addresses(candidates("tcp://h:1", None, profile, {})) == ["tcp://h:1"]
    assert addresses(candidates(None, None, profile, {"CQSD_ADDRESS": "unix:///e"})) == [
        "unix:///e"]


def test_the_daemons_config_names_its_socket(tmp_path):
    """--config, else $CQSD_CONFIG, else the profile's config; the socket given, or
    derived from data_dir as the daemon derives it; then the fallbacks, no repeats."""
    given = tmp_path / "a.toml"
    given.write_text('[daemon]\nsocket = "/run/x/a.sock"\n[[structure]]\nname = "S"\n')
    derived = tmp_path / "b.toml"
    derived.write_text('[daemon]\ndata_dir = "/var/lib/b"\n')
    profile = Profile(path="p", address="unix:///p.sock", config=str(derived))
    assert addresses(candidates(None, str(given), profile, {"CQSD_CONFIG": str(derived)})) == [
        "unix:///p.sock", "unix:///run/x/a.sock", SERVICE_SOCKET, "unix://./cqsd-data/cqsd.sock"]
    found = candidates(None, None, profile, {"CQSD_CONFIG": str(given)})
    assert found[1] == Candidate("unix:///run/x/a.sock", f"the socket in {given} ($CQSD_CONFIG)")
    assert addresses(candidates(None, None, profile, {}))[1] == "unix:///var/lib/b/cqsd.sock"


def test_a_config_that_cannot_be_read_is_noted(tmp_path):
    notes: list[str] = []
    found = candidates(None, str(tmp_path / "missing.toml"), Profile(), {}, notes)
    assert addresses(found) == [SERVICE_SOCKET, "unix://./cqsd-data/cqsd.sock"]
    assert notes == [f"{tmp_path / 'missing.toml'} (--config): no such file"]


def test_the_profile_is_read_and_checked(tmp_path):
    assert profile_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "cqsd" / "cqsctl.toml"
    assert profile_path({"CQSCTL_PROFILE": "/x/y.toml"}).as_posix() == "/x/y.toml"
    assert read_profile(tmp_path / "none.toml") == Profile()
    path = tmp_path / "cqsctl.toml"
    path.write_text('address = "unix:///run/cqsd/cqsd.sock"\nclient = "OPS"\n'
                    'secret_file = "~/ops.secret"\n')
    p = read_profile(path)
    assert (p.address, p.client, p.path) == ("unix:///run/cqsd/cqsd.sock", "OPS", str(path))
    assert not p.secret_file.startswith("~")
    path.write_text('adress = "unix:///x"\n')
    with pytest.raises(ValueError, match="unknown key.*adress"):
        read_profile(path)


def test_unreachable_names_every_address_and_the_ways_out():
    text = unreachable([(Candidate("unix:///a", "the socket in /etc/x (--config)"),
                         "No such file or directory")], ["/etc/y: Permission denied"], "/h/p")
    assert "unix:///a  (the socket in /etc/x (--config)): No such file or directory" in text
    assert "note: /etc/y: Permission denied" in text
    for way in ("--address", "$CQSD_ADDRESS", "--config", "$CQSD_CONFIG", "/h/p"):
        assert way in text


def test_cqsctl_says_what_it_tried(tmp_path):
    """A bare cqsctl on a host with no daemon: exit 3, and each address with its reason."""
    config = tmp_path / "cqsd.toml"
    config.write_text(f'[daemon]\nsocket = "{tmp_path}/gone.sock"\n')
    run = subprocess.run([sys.executable, "-m", "cqsclient.ctl", "status"], cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                              "CQSD_CONFIG": str(config), "PYTHONPATH": ":".join(sys.path)},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 3
    assert f"unix://{tmp_path}/gone.sock  (the socket in {config} ($CQSD_CONFIG))" in run.stderr
    assert "unix://./cqsd-data/cqsd.sock" in run.stderr and "point cqsctl" in run.stderr
