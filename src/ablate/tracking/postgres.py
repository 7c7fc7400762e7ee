"""The team server's own PostgreSQL cluster: created once under ``.server/pg`` from the
machine's PostgreSQL binaries, and reached by password only (scram-sha-256, on a socket and on
127.0.0.1), so another user of the machine cannot read or change the runs through it.

The password is generated with the cluster and kept in ``.server/pgpass`` (libpq's password
file, owner-only), which the MLflow server reads through ``PGPASSFILE``: it never appears in a
URL, a command line or a log.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

from ablate.errors import AblateError
from ablate.tracking.auth import new_password, write_private

PASSFILE = "pgpass"
USER, DATABASE = "ablate", "mlflow"
_AUTH = "scram-sha-256"


def pg_bin(name: str) -> str:
    """Path of a PostgreSQL program: on PATH, else the newest /usr/lib/postgresql/*/bin."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not candidates:
        raise AblateError(f"PostgreSQL's {name} not found (install PostgreSQL, or pass --db-url)")
    return candidates[-1]


def _as_postgres(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; drop to the distribution's postgres user when we are root.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _run(cmd: list[str], **kwargs) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0:
        raise AblateError(f"{' '.join(cmd)} failed: {proc.stderr.strip() or proc.stdout.strip()}")


def client_env(folder: Path) -> dict[str, str]:
    """The environment under which a client (the MLflow server, createdb) finds the password."""
    return {**os.environ, "PGPASSFILE": str(folder / PASSFILE)}


def _write_passfile(folder: Path, password: str) -> None:
    # any port: `make server PG_PORT=...` may move the cluster
    lines = [f"{host}:*:*:{USER}:{password}\n" for host in ("127.0.0.1", "localhost")]
    write_private(folder / PASSFILE, "".join(lines))


def _initdb(folder: Path, data: Path) -> None:
    password = new_password()
    data.mkdir(parents=True, exist_ok=True)
    pwfile = folder / ".pg-initpw"  # initdb reads it as postgres: not inside the empty data dir
    write_private(pwfile, password + "\n")
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
        shutil.chown(pwfile, "postgres", "postgres")
    try:
        _run(_as_postgres([
            pg_bin("initdb"), "-D", str(data), "-U", USER, "-A", _AUTH, f"--pwfile={pwfile}",
        ]))  # fmt: skip
    finally:
        pwfile.unlink(missing_ok=True)
    _write_passfile(folder, password)


def _close_trust(folder: Path, data: Path, port: int) -> None:
    """A cluster made by an earlier ablate trusted every local connection: give its user a
    password and ask for it from now on (the cluster runs, still trusting, when this is called)."""
    hba = data / "pg_hba.conf"
    active = [line for line in hba.read_text().splitlines() if not line.lstrip().startswith("#")]
    if not any(line.split()[-1:] == ["trust"] for line in active):
        raise AblateError(
            f"{folder / PASSFILE} is missing, and with it the password of the database in {data}: "
            f"restore the file, or move {data} away to start a new one"
        )
    password = new_password()
    # on stdin, not on the command line: `ps` shows command lines to every user
    _run(
        [pg_bin("psql"), "-h", "127.0.0.1", "-p", str(port), "-U", USER, "-d", "postgres",
         "-v", "ON_ERROR_STOP=1", "-q"],
        input=f"ALTER ROLE {USER} PASSWORD '{password}';\n",
    )  # fmt: skip
    _write_passfile(folder, password)
    kept = [line for line in hba.read_text().splitlines() if line.lstrip().startswith("#")]
    rules = [f"local all all {_AUTH}", f"host all all 127.0.0.1/32 {_AUTH}",
             f"host all all ::1/128 {_AUTH}"]  # fmt: skip
    hba.write_text("\n".join([*kept, *rules]) + "\n")
    _run(_as_postgres([pg_bin("pg_ctl"), "-D", str(data), "reload"]))


def start_postgres(folder: Path, port: int) -> str:
    """Create (once) and start the cluster in ``folder``; return its SQLAlchemy URL (no
    password in it: clients read ``folder``/pgpass, see ``client_env``)."""
    data = folder / "pg"
    fresh = not (data / "PG_VERSION").is_file()
    if fresh:
        _initdb(folder, data)
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")  # for the log and the socket
    _run(
        _as_postgres(
            [
                pg_bin("pg_ctl"), "-D", str(data), "-l", str(folder / "postgres.log"), "-w",
                "-o", f"-p {port} -k {folder} -c listen_addresses=127.0.0.1", "start",
            ]
        )
    )  # fmt: skip
    try:
        if not (folder / PASSFILE).is_file():
            _close_trust(folder, data, port)
        created = subprocess.run(
            [pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", USER, DATABASE],
            capture_output=True, text=True, env=client_env(folder),
        )  # fmt: skip
        if created.returncode != 0 and "already exists" not in created.stderr:
            raise AblateError(f"createdb failed: {created.stderr.strip()}")
    except BaseException:
        stop_postgres(str(data))  # nothing records it yet: do not leave it running
        raise
    return f"postgresql+psycopg2://{USER}@127.0.0.1:{port}/{DATABASE}"


def stop_postgres(data: str) -> None:
    """Stop the local cluster in folder ``data`` (fast shutdown), if it runs."""
    subprocess.run(
        _as_postgres([pg_bin("pg_ctl"), "-D", data, "-m", "fast", "-w", "stop"]),
        capture_output=True,
    )
