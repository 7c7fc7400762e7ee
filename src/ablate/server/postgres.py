"""The team server's own PostgreSQL cluster: created once under ``.server/pg`` from the
machine's PostgreSQL binaries, and reached by password only (scram-sha-256, on a socket and on
127.0.0.1), so another user of the machine cannot read or change the runs through it.

PostgreSQL owns its data folder (``pg``) and its run folder (``postgres``: the socket and
``postgres.log``), nothing else of ``.server/``. The server's database role (``ablate``) owns
the ``mlflow`` database and the lr studies' (``ablate_lrstudy``) and is no superuser; the
cluster's superuser is the OS user that runs PostgreSQL, reached only through the socket as that
OS user (peer), which is how ablate creates the role and the databases. The role's password is
generated into ``.server/pgpass`` (libpq's password file, readable by the MLflow server's user
only), which the server reads through ``PGPASSFILE``: it never appears in a URL, a command line
or a log.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from ablate.errors import AblateError
from ablate.server import namespace
from ablate.server.credentials import new_password, write_private

PASSFILE = "pgpass"
DATA, RUN, LOG = "pg", "postgres", "postgres.log"
USER, DATABASE = "ablate", "mlflow"
STUDIES = "ablate_lrstudy"  # the lr studies' (Optuna's RDB storage cannot share MLflow's)
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


def _superuser() -> str:
    """The OS user that runs PostgreSQL, and the name of the cluster's superuser."""
    # PostgreSQL refuses to run as root: it runs as the distribution's postgres user then
    return "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name


def _as_postgres(cmd: list[str]) -> list[str]:
    """``cmd`` as PostgreSQL's user when we are root; where its data or socket folder (after
    ``-D`` or ``-h``) lies behind a folder that user may not pass (a checkout under /root), in a
    mount namespace that shows it the server's folder alone (``ablate.server.namespace``)."""
    if os.geteuid() != 0:
        return cmd
    named = [cmd[i + 1] for i, arg in enumerate(cmd[:-1]) if arg in ("-D", "-h")]
    folders = [Path(path).resolve().parent for path in named]
    gid = pwd.getpwnam("postgres").pw_gid
    shown = namespace.revealing(namespace.behind_closed(folders, gid), "PostgreSQL's user")
    return [*shown, "runuser", "-u", "postgres", "--", *cmd]


def _run(cmd: list[str], **kwargs) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0:
        raise AblateError(f"{' '.join(cmd)} failed: {proc.stderr.strip() or proc.stdout.strip()}")


def private_dir(path: Path, owner: tuple[int, int] | None) -> None:
    """``path`` as a folder of ``owner`` (uid, gid; None: ours) that only it may read (0700);
    a symlink there is refused, never followed."""
    path.mkdir(mode=0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise AblateError(f"{path}: not a plain folder ({exc.strerror}); move it away") from None
    try:
        if owner is not None:
            os.fchown(fd, *owner)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _postgres_owner() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid


def client_env(folder: Path) -> dict[str, str]:
    """The environment under which a client (the MLflow server) finds the password."""
    return {**os.environ, "PGPASSFILE": str(folder / PASSFILE)}


def _write_passfile(folder: Path, password: str, owner: tuple[int, int] | None) -> None:
    # any port: `make server PG_PORT=...` may move the cluster
    lines = [f"{host}:*:*:{USER}:{password}\n" for host in ("127.0.0.1", "localhost")]
    write_private(folder / PASSFILE, "".join(lines), owner)


def _hba(superuser: str) -> str:
    # the superuser only on the socket as its own OS user; everyone else by password
    rules = [
        f"local all {superuser} peer",
        f"local all all {_AUTH}",
        f"host all all 127.0.0.1/32 {_AUTH}",
        f"host all all ::1/128 {_AUTH}",
    ]
    return "\n".join(rules) + "\n"


def _initdb(data: Path) -> None:
    private_dir(data, _postgres_owner())
    _run(
        _as_postgres(
            [
                pg_bin("initdb"),
                "-D",
                str(data),
                "-U",
                _superuser(),
                "--auth-local=peer",
                f"--auth-host={_AUTH}",
            ]
        )
    )
    write_private(data / "pg_hba.conf", _hba(_superuser()), _postgres_owner())


def _psql(folder: Path, port: int, sql: str) -> None:
    """``sql`` as the cluster's superuser, on the socket (on stdin: `ps` shows command lines
    to every user)."""
    _run(
        _as_postgres(
            [
                pg_bin("psql"),
                "-X",
                "-q",
                "-h",
                str(folder / RUN),
                "-p",
                str(port),
                "-U",
                _superuser(),
                "-d",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
            ]
        ),
        input=sql,
    )


def _create_database(name: str) -> str:
    """SQL that creates database ``name``, owned by the server's role, unless it exists."""
    return (
        f"SELECT 'CREATE DATABASE {name} OWNER {USER}' WHERE NOT EXISTS "
        f"(SELECT FROM pg_database WHERE datname = '{name}')\\gexec\n"
    )


def study_url(port: int) -> str:
    """The SQLAlchemy URL of the lr studies' database (the password: ``client_env``)."""
    return f"postgresql+psycopg2://{USER}@127.0.0.1:{port}/{STUDIES}"


def _give_role(folder: Path, port: int, server: tuple[int, int] | None) -> None:
    """The server's role (no superuser, a new password) and its database."""
    password = new_password()
    _psql(
        folder,
        port,
        f"DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{USER}') THEN "
        f"CREATE ROLE {USER}; END IF; END$$;\n"
        f"ALTER ROLE {USER} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION "
        f"PASSWORD '{password}';\n" + _create_database(DATABASE),
    )
    _write_passfile(folder, password, server)


def _close_trust(folder: Path, data: Path, port: int, server: tuple[int, int] | None) -> None:
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
    _run(
        _psql_as_role(port),
        input=f"ALTER ROLE {USER} PASSWORD '{password}';\n",
    )
    _write_passfile(folder, password, server)
    kept = [line for line in hba.read_text().splitlines() if line.lstrip().startswith("#")]
    rules = [
        f"local all all {_AUTH}",
        f"host all all 127.0.0.1/32 {_AUTH}",
        f"host all all ::1/128 {_AUTH}",
    ]
    write_private(hba, "\n".join([*kept, *rules]) + "\n", _postgres_owner())
    _run(_as_postgres([pg_bin("pg_ctl"), "-D", str(data), "reload"]))


def _psql_as_role(port: int) -> list[str]:
    """psql over TCP as the server's role, on the maintenance database, stopping at an error."""
    where = ["-h", "127.0.0.1", "-p", str(port), "-U", USER, "-d", "postgres"]
    return [pg_bin("psql"), "-X", "-q", *where, "-v", "ON_ERROR_STOP=1"]


def _demote(folder: Path, data: Path, port: int) -> None:
    """A cluster made by an earlier ablate, whose server role was the cluster's superuser: the
    OS user that runs PostgreSQL becomes the superuser (on the socket, as itself), the role an
    ordinary owner of its database."""
    su = _superuser()
    proc = subprocess.run(
        _psql_as_role(port),
        input=f"DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{su}') THEN "
        f'CREATE ROLE "{su}" SUPERUSER LOGIN; END IF; END$$;\nSET ROLE "{su}";\n'
        f"ALTER ROLE {USER} NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;\n",
        capture_output=True,
        text=True,
        env=client_env(folder),
    )
    if proc.returncode != 0:  # PostgreSQL 16 and later keep their first role a superuser
        raise AblateError(
            f"the database role {USER} of {data} is its cluster's superuser (made by an earlier "
            f"ablate) and cannot be demoted ({proc.stderr.strip()}): dump the database "
            f"(pg_dump), move {data} away and restore it into the new cluster"
        )
    write_private(data / "pg_hba.conf", _hba(su), _postgres_owner())
    _run(_as_postgres([pg_bin("pg_ctl"), "-D", str(data), "reload"]))


def _log_cause(log: Path) -> str:
    """The last FATAL or ERROR line of PostgreSQL's log: why it did not start."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    causes = [line for line in lines if "FATAL" in line or "ERROR" in line]
    return (causes or lines or ["no log"])[-1].strip()


def start_postgres(folder: Path, port: int, server: tuple[int, int] | None = None) -> str:
    """Create (once) and start the cluster in ``folder``; return its SQLAlchemy URL (no
    password in it: the server reads ``folder``/pgpass, see ``client_env``). ``server``: the
    MLflow server's (uid, gid), which gets the password file."""
    data, run = folder / DATA, folder / RUN
    if not (data / "PG_VERSION").is_file():
        _initdb(data)
    private_dir(run, _postgres_owner())  # the socket and the log
    log = run / LOG
    proc = subprocess.run(
        _as_postgres(
            [
                pg_bin("pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(log),
                "-w",
                "-o",
                f"-p {port} -k {run} -c listen_addresses=127.0.0.1",
                "start",
            ]
        ),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise AblateError(f"PostgreSQL did not start on port {port}: {_log_cause(log)} ({log})")
    try:
        ours = f"local all {_superuser()} peer" in (data / "pg_hba.conf").read_text()
        if not (folder / PASSFILE).is_file():
            if ours:
                _give_role(folder, port, server)
            else:
                _close_trust(folder, data, port, server)
        if not ours:
            _demote(folder, data, port)
        if server is not None:  # the server's user reads it
            os.chown(folder / PASSFILE, *server)
        _psql(folder, port, _create_database(STUDIES))  # a cluster older than the studies'
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
