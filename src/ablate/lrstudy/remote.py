"""An lr study's storage on an ablate team server (``make server``), reached with the member's
MLflow login: Optuna's gRPC storage proxy, which the server runs beside MLflow on a database of
its own (``ablate.server.studies``).

The proxy's address is the tracking server's host and the port the server names at
``INFO_PATH`` (a route of the server's MLflow app that answers without a password: the port is
no secret, the proxy itself asks for the login), so a member needs no setting beyond
``MLFLOW_TRACKING_URI`` and the MLflow credentials (``MLFLOW_TRACKING_USERNAME``/``PASSWORD``
or ``~/.mlflow/credentials``). Every call carries them as an ``authorization: Basic`` header,
as MLflow's REST client sends them; a second service of the proxy carries the trials'
heartbeats, which Optuna's proxy does not, so a study that dies on another machine has its
trial retried there too.
"""

from __future__ import annotations

import base64
import functools
import json
import warnings
from typing import Any
from urllib.parse import urlparse

import grpc
from optuna.exceptions import ExperimentalWarning
from optuna.storages import GrpcStorageProxy
from optuna.storages._heartbeat import BaseHeartbeat

from ablate.errors import AblateError
from ablate.tracking.auth import STUDY_INFO_PATH as INFO_PATH  # {"port": <the proxy's port>}

SCHEME = "grpc://"
HEARTBEAT_SERVICE = "ablate.StudyHeartbeat"
LOGIN = "Login"  # a call that writes nothing, checked as a write: a reader is refused at once
# a study process beats every HEARTBEAT_S; its RUNNING trial is failed (and retried) after
# GRACE_S without one; the server's storage and a local one use the same
HEARTBEAT_S, GRACE_S = 30, 120


@functools.lru_cache(maxsize=8)
def discover(tracking_uri: str) -> str:
    """``grpc://host:port`` of the study storage that the team server at ``tracking_uri``
    serves; an error saying why none is there (not an ablate team server, no answer)."""
    import requests

    try:
        resp = requests.get(tracking_uri.rstrip("/") + INFO_PATH, timeout=30)
        port = int(resp.json()["port"]) if resp.status_code == 200 else None
    except requests.RequestException as exc:
        raise AblateError(f"it does not answer: {exc}") from None
    except (ValueError, KeyError, TypeError):
        port = None
    if port is None:
        raise AblateError("it serves no lr studies, as an ablate team server (make server) does")
    host = urlparse(tracking_uri).hostname
    return f"{SCHEME}{f'[{host}]' if ':' in host else host}:{port}"


def _login_header() -> str:
    """``Basic ...`` of the MLflow credentials this process uses (MLflow's own lookup)."""
    from mlflow.utils.credentials import read_mlflow_creds

    creds = read_mlflow_creds()
    if not creds.username or not creds.password:
        raise AblateError(
            "an lr study on the team server needs your MLflow login: set "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or save the credentials file "
            "the admin handed over as ~/.mlflow/credentials"
        )
    return "Basic " + base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()


def _encode(value: dict) -> bytes:
    return json.dumps(value).encode()


class TeamStorage(GrpcStorageProxy, BaseHeartbeat):
    """Optuna's gRPC proxy client that logs in with the member's MLflow credentials and beats
    its trials' heartbeats through the server."""

    def __init__(self, url: str, stale_trial_callback=None):
        where = urlparse(url)
        if where.scheme != SCHEME.removesuffix("://") or not where.port:
            raise AblateError(f"lr_study.storage={url}: expected grpc://<host>:<port>")
        self._url, self._header, self._callback = url, _login_header(), stale_trial_callback
        with warnings.catch_warnings():  # Optuna's proxy: experimental in Optuna 4 and 5
            warnings.simplefilter("ignore", ExperimentalWarning)
            super().__init__(host=where.hostname, port=where.port)

    def _setup(self) -> None:
        from optuna.storages._grpc.auto_generated import api_pb2_grpc
        from optuna.storages._grpc.client import GrpcClientCache, create_insecure_channel

        self._channel = grpc.intercept_channel(
            create_insecure_channel(self._host, self._port), _Login(self._header)
        )
        self._stub = api_pb2_grpc.StorageServiceStub(self._channel)
        self._cache = GrpcClientCache(self._stub)
        self._beats = {
            name: self._channel.unary_unary(
                f"/{HEARTBEAT_SERVICE}/{name}",
                request_serializer=_encode,
                response_deserializer=json.loads,
            )
            for name in ("RecordHeartbeat", "GetStaleTrialIds", LOGIN)
        }

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()
        state.pop("_beats", None)
        return state

    def check(self) -> None:
        """One line, before the study opens, when the server is unreachable or refuses this
        member writing (a wrong login, a reader)."""
        try:
            self._beats[LOGIN]({})
        except grpc.RpcError as exc:
            raise AblateError(f"lr study storage {self._url}: {refusal(exc)}") from None

    def record_heartbeat(self, trial_id: int) -> None:
        self._beats["RecordHeartbeat"]({"trial_id": trial_id})

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        return self._beats["GetStaleTrialIds"]({"study_id": study_id})["trial_ids"]

    def get_heartbeat_interval(self) -> int:
        return HEARTBEAT_S

    def get_heartbeat_stale_trial_callback(self):
        return self._callback


def refusal(exc) -> str:
    """What a gRPC error from the proxy says, in one line."""
    if exc.code() == grpc.StatusCode.UNAVAILABLE:
        return "the server's lr-study port does not answer (a firewall between?)"
    return exc.details() or exc.code().name


class _Login(grpc.UnaryUnaryClientInterceptor):
    """Adds the login to every call (a gRPC client interceptor)."""

    def __init__(self, header: str):
        self.header = header

    def intercept_unary_unary(self, continuation, details, request):
        metadata = [*(details.metadata or ()), ("authorization", self.header)]
        return continuation(details._replace(metadata=metadata), request)
