"""`alpamayo curve-keys` keeps an existing key pair unless told --force (peers hold its public key)."""

from __future__ import annotations

from alpamayo.cli import main


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
