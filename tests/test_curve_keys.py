"""`alpamayo curve-keys` keeps an existing key pair unless told --force (peers hold its public key)."""

from __future__ import annotations

import os
import stat

import zmq.auth

from alpamayo.cli import main
from bridges.wire.sockets import create_keys, load_key_file


def test_curve_keys_refuses_to_replace_a_pair_without_force(tmp_path, capsys):
    assert main(["curve-keys", str(tmp_path), "--name", "node"]) == 0
    public, secret = tmp_path / "node.key", tmp_path / "node.key_secret"
    before = public.read_bytes(), secret.read_bytes()
    assert main(["curve-keys", str(tmp_path), "--name", "node"]) == 2
    err = capsys.readouterr().err
    assert f"{public}, {secret} already exist(s)" in err and "pass --force" in err
    assert (public.read_bytes(), secret.read_bytes()) == before
    assert main(["curve-keys", str(tmp_path), "--name", "node", "--force"]) == 0
    assert public.read_bytes() != before[0] and secret.stat().st_mode & 0o777 == 0o600
    assert main(["curve-keys", str(tmp_path), "--name", "camera"]) == 0  # another name is another pair


def test_the_secret_key_is_never_readable_by_others(tmp_path, monkeypatch):
    """pyzmq writes the secret with the process umask (0644 under umask 022); the pair is written where
    nobody else can reach it (a 0700 directory) and lands 0600, with no temporary directory left behind."""
    write = zmq.auth.create_certificates
    seen: list[int] = []

    def watched(directory: str, name: str) -> tuple[str, str]:
        seen.append(stat.S_IMODE(os.stat(directory).st_mode))
        return write(directory, name)

    monkeypatch.setattr(zmq.auth, "create_certificates", watched)
    keys = tmp_path / "keys"
    keys.mkdir()
    keys.chmod(0o755)  # a shared directory, as /etc/alpamayo would be
    old = os.umask(0o022)
    try:
        public, secret = create_keys(keys, "node")
    finally:
        os.umask(old)
    assert seen and all(mode & 0o077 == 0 for mode in seen), [oct(m) for m in seen]
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert sorted(p.name for p in keys.iterdir()) == ["node.key", "node.key_secret"]
    assert load_key_file(public)[1] is None and load_key_file(secret, secret=True)[1] is not None
