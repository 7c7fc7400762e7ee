"""A team tracking server: ``mlflow server`` on a PostgreSQL backend, started and stopped by pid.

``python -m ablate.server start`` creates (once) a PostgreSQL cluster under ``.server/pg`` from the
machine's PostgreSQL binaries — or uses ``--db-url`` for an existing database — and starts
``mlflow server`` on 127.0.0.1 with an artifact root under ``.server/artifacts``.
``python -m ablate.server stop`` stops what ``start`` started, by the pids it recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ablate.config import project_root
from ablate.errors import AblateError
from ablate.tracking import procs

STATE = "server.json"


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


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AblateError(f"{' '.join(cmd)} failed: {proc.stderr.strip() or proc.stdout.strip()}")


def start_postgres(folder: Path, port: int) -> str:
    """Create (once) and start a local cluster in ``folder``; return its SQLAlchemy URL."""
    data = folder / "pg"
    if not (data / "PG_VERSION").is_file():
        data.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(data, "postgres", "postgres")
        _run(_as_postgres([pg_bin("initdb"), "-D", str(data), "-U", "ablate", "-A", "trust"]))
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
    created = subprocess.run(
        [pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "ablate", "mlflow"],
        capture_output=True,
        text=True,
    )
    if created.returncode != 0 and "already exists" not in created.stderr:
        stop_postgres(str(data))  # nothing records it yet: do not leave it running
        raise AblateError(f"createdb failed: {created.stderr.strip()}")
    return f"postgresql+psycopg2://ablate@127.0.0.1:{port}/mlflow"


def stop_postgres(data: str) -> None:
    """Stop the local cluster in folder ``data`` (fast shutdown), if it runs."""
    subprocess.run(
        _as_postgres([pg_bin("pg_ctl"), "-D", data, "-m", "fast", "-w", "stop"]),
        capture_output=True,
    )


def wait_healthy(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Wait until ``url``/health answers OK; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AblateError(f"mlflow server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise AblateError(f"mlflow server at {url} not healthy after {timeout:.0f} s")


def start(folder: Path, port: int, pg_port: int, db_url: str | None, timeout: float = 120) -> str:
    """Start PostgreSQL (unless ``db_url``) and the MLflow server; return the tracking URI."""
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / STATE).is_file():
        raise AblateError(f"{folder / STATE}: a server is already recorded; stop it first")
    _check_port_free(port)
    state: dict = {"port": port}
    if db_url is None:
        db_url = start_postgres(folder, pg_port)
        state["pg_data"] = str(folder / "pg")
        (folder / STATE).write_text(json.dumps(state))  # stop() can stop it, whatever follows
    try:
        return _start_mlflow(folder, port, db_url, state, timeout)
    except BaseException:
        stop(folder)
        raise


def _start_mlflow(folder: Path, port: int, db_url: str, state: dict, timeout: float) -> str:
    (folder / "artifacts").mkdir(exist_ok=True)
    log = open(folder / "mlflow.log", "ab")  # noqa: SIM115  (the server outlives this function)
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", db_url,
            "--artifacts-destination", str(folder / "artifacts"),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "2",
        ],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )  # fmt: skip
    state["mlflow_pid"] = proc.pid
    state["mlflow_started"] = procs.started(proc.pid)
    (folder / STATE).write_text(json.dumps(state))
    uri = f"http://127.0.0.1:{port}"
    wait_healthy(uri, timeout, proc)
    if proc.poll() is not None:  # something else answered on the port
        raise AblateError(f"mlflow server exited with code {proc.returncode}")
    return uri


def _check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # as the server binds: a port left in TIME_WAIT is free, a listening one is not
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise AblateError(
                f"port {port} on 127.0.0.1 is taken ({exc.strerror}; `make ui` uses it too?): "
                f"choose another with --port (make server PORT=...)"
            ) from None


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # gone meanwhile
        os.killpg(pid, sig)


def stop(folder: Path) -> None:
    """Stop the MLflow server and the PostgreSQL cluster recorded in ``folder``.

    The server is signalled only if its pid still belongs to the process that ``start`` started
    (same start time); a pid reused by another process is left alone.
    """
    path = folder.resolve() / STATE
    if not path.is_file():
        return
    state = json.loads(path.read_text())
    try:
        pid = state.get("mlflow_pid")
        if pid and procs.same(pid, state.get("mlflow_started")):
            for sig in (signal.SIGTERM, signal.SIGKILL):  # a polite stop first, up to 10 s each
                _signal_group(pid, sig)  # the server and its workers share its session
                deadline = time.monotonic() + 10
                while procs.alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if not procs.alive(pid):
                    break
        if state.get("pg_data"):
            stop_postgres(state["pg_data"])
    finally:
        path.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="Team MLflow tracking server on PostgreSQL.")
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--dir", type=Path, default=project_root() / ".server")
    parser.add_argument("--port", type=int, default=5000, help="MLflow server port")
    parser.add_argument("--pg-port", type=int, default=5433, help="local PostgreSQL port")
    parser.add_argument("--db-url", default=None, help="existing database (SQLAlchemy URL)")
    args = parser.parse_args()
    try:
        if args.action == "start":
            uri = start(args.dir, args.port, args.pg_port, args.db_url)
            print(f"MLflow server at {uri} (logs in {args.dir}); use it with:")
            print(f"  export MLFLOW_TRACKING_URI={uri}    # or tracking.uri={uri}")
        else:
            stop(args.dir)
            print(f"stopped the server recorded in {args.dir}")
    except AblateError as exc:
        print(f"ablate.server: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
