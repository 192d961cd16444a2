"""A real SMTP server for the notification tests (aiosmtpd from PyPI), on 127.0.0.1 only.

It offers STARTTLS with the given certificate, requires AUTH (PLAIN or LOGIN) with the given
user and password after STARTTLS, and writes every message it accepts to DIR as <n>.eml.
Prints "ready" once it listens. Usage:

    python smtp-test-server.py PORT CERT KEY USER PASSWORD DIR
"""

import asyncio
import pathlib
import ssl
import sys

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword


class Saver:
    def __init__(self, out: pathlib.Path):
        self.out = out
        self.n = 0

    async def handle_DATA(self, server, session, envelope):
        self.n += 1
        path = self.out / f"{self.n:04d}.eml"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(envelope.original_content or envelope.content)
        tmp.rename(path)
        return "250 OK"


def authenticator(user: bytes, password: bytes):
    def check(server, session, envelope, mechanism, auth_data):
        if not isinstance(auth_data, LoginPassword):
            return AuthResult(success=False, handled=False)
        ok = auth_data.login == user and auth_data.password == password
        return AuthResult(success=ok)

    return check


def main() -> None:
    port, cert, key, user, password, out = sys.argv[1:7]
    out_dir = pathlib.Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    controller = Controller(
        Saver(out_dir),
        hostname="127.0.0.1",
        port=int(port),
        tls_context=context,
        require_starttls=True,
        auth_require_tls=True,
        auth_required=True,
        authenticator=authenticator(user.encode(), password.encode()),
    )
    controller.start()
    print("ready", flush=True)
    try:
        asyncio.get_event_loop().run_until_complete(asyncio.Event().wait())
    finally:
        controller.stop()


if __name__ == "__main__":
    main()
