"""ZeroMQ socket set-up shared by the node and the clients: options, bind/connect, CURVE keys.

Options (reference/bridge.md §3.2): LINGER short so closing never hangs `ctx.term()`; ZMTP heartbeats so a
dead peer is noticed within 3 intervals; ZMQ_MAXMSGSIZE on every receiving socket so a peer sending more is
disconnected by libzmq before the message is buffered.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, overload

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

DEFAULT_LINGER_MS = 100
DEFAULT_HEARTBEAT_MS = 1000
Z85_KEY_CHARS = 40  # a 32-byte CURVE key in Z85 text


def make_socket(
    ctx: zmq.Context,
    kind: int,
    *,
    linger_ms: int = DEFAULT_LINGER_MS,
    heartbeat_ms: int = DEFAULT_HEARTBEAT_MS,
    max_message_bytes: int | None = None,
    hwm: int | None = None,
) -> zmq.Socket:
    """A socket of `kind` (zmq.SUB, zmq.PUB, ...) with the project's options; hwm sets both SND and RCV."""
    sock = ctx.socket(kind)
    sock.linger = linger_ms
    sock.heartbeat_ivl = heartbeat_ms
    sock.heartbeat_timeout = 3 * heartbeat_ms
    sock.heartbeat_ttl = 3 * heartbeat_ms
    if max_message_bytes is not None:
        sock.maxmsgsize = max_message_bytes
    if hwm is not None:
        sock.sndhwm = hwm
        sock.rcvhwm = hwm
    return sock


def attach(sock: zmq.Socket, endpoint: str, bind: bool) -> str:
    """Bind or connect; returns the endpoint peers should use (a bound `tcp://HOST:*` resolves its port)."""
    try:
        if bind:
            sock.bind(endpoint)
            return sock.getsockopt_string(zmq.LAST_ENDPOINT)
        sock.connect(endpoint)
    except zmq.ZMQError as e:
        raise ValueError(f"cannot {'bind' if bind else 'connect'} {endpoint}: {e}") from None
    return endpoint


@dataclass(frozen=True)
class CurveClientKeys:
    """A client's CURVE key pair and the server's public key (Z85 bytes, 40 characters each)."""

    public: bytes
    secret: bytes
    server_public: bytes

    @classmethod
    def from_files(cls, client_secret_file: str | Path, server_public_file: str | Path) -> CurveClientKeys:
        """client_secret_file: the client's NAME.key_secret; server_public_file: the node's NAME.key."""
        public, secret = load_key_file(client_secret_file, secret=True)
        server_public, _ = load_key_file(server_public_file)
        return cls(public, secret, server_public)

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
        sock.curve_serverkey = self.server_public


class CurveServer:
    """The node's CURVE identity plus a ZAP authenticator that admits only the allow-listed client keys."""

    def __init__(self, ctx: zmq.Context, server_secret_key: str | Path, authorized_keys: str | Path):
        self.public, self._secret = load_key_file(server_secret_key, secret=True)
        self.authorized_keys = Path(authorized_keys)
        # zmq's authenticator only logs a key file it cannot read and then admits no client at all: read the
        # allow-list here first, so a bad or missing key is an error naming the file.
        allowed = sorted(self.authorized_keys.glob("*.key"))
        if not allowed:
            raise ValueError(
                f"CURVE allow-list {self.authorized_keys} holds no *.key file: it would admit no client"
            )
        for path in allowed:
            load_key_file(path)
        self._auth = ThreadAuthenticator(ctx)
        self._auth.start()
        self._auth.configure_curve(domain="*", location=str(self.authorized_keys))

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_server = True
        sock.curve_publickey = self.public
        sock.curve_secretkey = self._secret

    def stop(self) -> None:
        self._auth.stop()


@overload
def load_key_file(path: str | Path, secret: Literal[True]) -> tuple[bytes, bytes]: ...
@overload
def load_key_file(path: str | Path, secret: bool = False) -> tuple[bytes, bytes | None]: ...
def load_key_file(path: str | Path, secret: bool = False) -> tuple[bytes, bytes | None]:
    """(public, secret) Z85 keys of a key file written by `create_keys`; secret is None in a public NAME.key.
    ValueError naming the file when it is absent, is not a key file, or (secret=True) holds no secret key."""
    if not Path(path).is_file():
        raise ValueError(f"CURVE key file {path} does not exist")
    try:
        public, secret_key = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as e:
        raise ValueError(f"CURVE key file {path} cannot be read: {e}") from None
    if secret and secret_key is None:
        raise ValueError(f"CURVE key file {path} holds no secret key (use the NAME.key_secret file)")
    for key in (public, secret_key):
        if key is not None and len(key) != Z85_KEY_CHARS:
            raise ValueError(
                f"CURVE key file {path} holds a key of {len(key)} characters, expected {Z85_KEY_CHARS} (Z85)"
            )
    return public, secret_key


def create_keys(directory: str | Path, name: str, overwrite: bool = False) -> tuple[Path, Path]:
    """Write NAME.key (public) and NAME.key_secret (both keys) into `directory`; returns their paths. An
    existing pair is kept (ValueError) unless `overwrite`: replacing it locks out every peer holding the old
    public key."""
    out = Path(directory)
    held = [p for p in (out / f"{name}.key", out / f"{name}.key_secret") if p.exists()]
    if held and not overwrite:
        raise ValueError(
            f"{', '.join(map(str, held))} already exist(s); a new pair would lock out every peer holding the "
            "old public key: pass --force to replace it, or choose another --name"
        )
    out.mkdir(parents=True, exist_ok=True)
    # pyzmq writes the secret with the process umask (often world-readable) and a chmod after it leaves a
    # window: write the pair inside a private (0700) directory, restrict the secret, then move both in.
    with tempfile.TemporaryDirectory(dir=out, prefix=f".{name}.") as private:
        public, secret = map(Path, zmq.auth.create_certificates(private, name))
        secret.chmod(0o600)
        os.replace(public, out / public.name)
        os.replace(secret, out / secret.name)
    return out / public.name, out / secret.name
