"""Failed logins, and who they hold back (``ablate.server.app``'s guard).

A client that fails 10 times within 5 minutes for one user name is refused for that name (429)
until the window has passed: counted per user name and client address together, so a flood of
wrong passwords from one address does not lock the same user out elsewhere. An address with 30
failures in the window is refused for every name that failed from it (a password sprayer), never
for a user with no failed login from it: the members behind one SSH tunnel share 127.0.0.1. The
admin's own commands on the server's machine (``make member``, ``make password``) carry a key
only root reads (``local_admin``) and are never refused.

In a SQLite file the server's workers share: Flask-Limiter and ``limits`` count in one process,
or in a Redis or memcached service, and the server has two workers and no such service.
"""

from __future__ import annotations

import sqlite3
import threading
import time

PER_USER, PER_ADDRESS, WINDOW_S = 10, 30, 300


class LoginFailures:
    """Failed logins of the last ``WINDOW_S``, by user name and client address."""

    def __init__(self, path: str):
        self.db = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
        self.lock = threading.Lock()
        with self.lock:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("CREATE TABLE IF NOT EXISTS failed (user TEXT, address TEXT, at REAL)")
            self.db.execute("CREATE INDEX IF NOT EXISTS by_address ON failed (address, user, at)")

    def blocked(self, user: str, address: str) -> str | None:
        """Why ``user`` from ``address`` is refused now (None: it is not)."""
        since = time.time() - WINDOW_S
        with self.lock:
            (pair,) = self.db.execute(
                "SELECT count(*) FROM failed WHERE address = ? AND user = ? AND at > ?",
                (address, user, since),
            ).fetchone()
            (everyone,) = self.db.execute(
                "SELECT count(*) FROM failed WHERE address = ? AND at > ?", (address, since)
            ).fetchone()
        if pair >= PER_USER:
            return "too many failed logins for this user from this address"
        if pair and everyone >= PER_ADDRESS:
            return "too many failed logins from this address"
        return None

    def failed(self, user: str, address: str) -> None:
        now = time.time()
        with self.lock:
            self.db.execute("INSERT INTO failed VALUES (?, ?, ?)", (user, address, now))
            self.db.execute("DELETE FROM failed WHERE at < ?", (now - WINDOW_S,))
