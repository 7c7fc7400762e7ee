"""The team server's lr-study storage: Optuna's gRPC storage proxy on a database of its own
(``ablate_lrstudy`` in the server's PostgreSQL cluster), behind the members' MLflow logins.

Optuna's RDB storage cannot share MLflow's database (both keep an ``alembic_version`` table),
and PostgreSQL listens on 127.0.0.1 only: members elsewhere reach their studies through this
proxy, which ``ablate.server start`` runs as the server's own user beside MLflow (``python -m
ablate.server.studies``). Optuna's proxy has no login, so every call passes ``Members`` first:
the ``authorization: Basic`` header a member's client sends (``ablate.lrstudy.remote``) is
checked against MLflow's user store, with the MLflow app's limits on failed logins (the same
file), and only the admin and editors write: a reader reads studies, nothing more. A second
service carries the trials' heartbeats (Optuna's proxy has none), so a study process that dies
on any machine has its trial retried.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from ablate.lrstudy.remote import GRACE_S, HEARTBEAT_S, HEARTBEAT_SERVICE, LOGIN
from ablate.server.app import grants
from ablate.server.logins import LoginFailures

CACHE_S = 60  # as the MLflow app: a changed password or role counts within a minute


def _peer_address(peer: str) -> str:
    """``ipv4:1.2.3.4:567`` / ``ipv6:[::1]:567`` -> the address alone."""
    address = peer.partition(":")[2].rpartition(":")[0]
    return address.strip("[]") or peer


class Members(grpc.ServerInterceptor):
    """Every call logs in with a member's MLflow credentials; only the admin and editors write,
    and only the admin deletes a study (ablate never does: an editor must not wipe others')."""

    def __init__(self, users_db: str, logins: str):
        from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

        self.store = SqlAlchemyStore()
        self.store.init_db(f"sqlite:///{users_db}")
        self.failures = LoginFailures(logins)
        self.known: dict[tuple[str, str], tuple[float, str]] = {}
        self.lock = threading.Lock()

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None:  # no such call
            return None
        if handler.unary_unary is None:  # Optuna's calls and ours are all unary: refuse others
            return grpc.unary_unary_rpc_method_handler(
                lambda request, context: context.abort(
                    grpc.StatusCode.UNIMPLEMENTED, "no such call"
                )
            )
        call = details.method.rpartition("/")[2]
        needs = "read" if call.startswith("Get") else "delete" if call == "DeleteStudy" else "write"
        header = dict(details.invocation_metadata).get("authorization", "")
        inner = handler.unary_unary

        def checked(request, context):
            self.check(header, needs, context)
            return inner(request, context)

        return handler._replace(unary_unary=checked)

    def check(self, header: str, needs: str, context) -> None:
        """Abort the call unless ``header`` logs in a member allowed to ``needs`` (read, write,
        delete)."""
        scheme, _, token = header.partition(" ")
        try:
            user, colon, password = base64.b64decode(token, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            colon = user = ""
        if scheme.lower() != "basic" or not colon or not user:
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "the team server's login (MLflow credentials) is missing",
            )
        login = (user, _peer_address(context.peer()))
        if why := self.failures.blocked(*login):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{why}: try again later")
        role = self._role(user, password)
        if role is None:
            self.failures.failed(*login)
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"user {user}: wrong user name or password (the MLflow login)",
            )
        if needs == "delete" and role != "admin":
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "only the admin deletes a study")
        if needs == "write" and role == "reader":
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{user} is a reader of the team server: an lr study writes its trials, which "
                "needs an editor (make member NAME=... ROLE=editor)",
            )

    def _role(self, user: str, password: str) -> str | None:
        """``user``'s role (admin, editor or reader; None: a wrong login), remembered for
        ``CACHE_S``."""
        key = (user, hashlib.sha256(password.encode()).hexdigest())
        with self.lock:
            until, role = self.known.get(key, (0.0, ""))
        if until > time.monotonic():
            return role
        if not self.store.authenticate_user(user, password):
            return None
        admin, writes = grants(user, self.store)
        role = "admin" if admin else "editor" if writes else "reader"
        with self.lock:
            self.known[key] = (time.monotonic() + CACHE_S, role)
        return role


def _heartbeats(storage) -> grpc.GenericRpcHandler:
    """The heartbeat calls of an RDB storage (Optuna's own), as a JSON service."""

    def record(request, context):
        storage.record_heartbeat(int(request["trial_id"]))
        return {}

    def stale(request, context):
        return {"trial_ids": storage._get_stale_trial_ids(int(request["study_id"]))}

    calls = {"RecordHeartbeat": record, "GetStaleTrialIds": stale, LOGIN: lambda r, c: {}}
    return grpc.method_handlers_generic_handler(
        HEARTBEAT_SERVICE,
        {
            name: grpc.unary_unary_rpc_method_handler(
                call,
                request_deserializer=json.loads,
                response_serializer=lambda value: json.dumps(value).encode(),
            )
            for name, call in calls.items()
        },
    )


def serve(db_url: str, host: str, port: int, users_db: str, logins: str) -> None:
    """Serve the studies in ``db_url`` on ``host``:``port`` until SIGTERM."""
    import warnings

    import optuna
    from optuna.storages._grpc.auto_generated import api_pb2_grpc
    from optuna.storages._grpc.servicer import OptunaStorageProxyService

    with warnings.catch_warnings():  # heartbeat arguments: experimental in Optuna 2 to 5
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        rdb = optuna.storages.RDBStorage(
            db_url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S
        )
    storage = optuna.storages.get_storage(rdb)  # Optuna's cache in front, as its proxy advises
    server = grpc.server(
        ThreadPoolExecutor(max_workers=16), interceptors=[Members(users_db, logins)]
    )
    api_pb2_grpc.add_StorageServiceServicer_to_server(OptunaStorageProxyService(storage), server)
    server.add_generic_rpc_handlers((_heartbeats(storage),))
    server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(grace=1))  # its calls are short
    print(f"lr-study storage on {host}:{port}", flush=True)
    server.wait_for_termination()


def main(argv: list[str] | None = None) -> None:
    """``python -m ablate.server.studies``: what ``ablate.server start`` runs."""
    parser = argparse.ArgumentParser(prog="python -m ablate.server.studies")
    for name in ("--db-url", "--host", "--users-db", "--logins"):
        parser.add_argument(name, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    serve(args.db_url, args.host, args.port, args.users_db, args.logins)


if __name__ == "__main__":
    main()
