"""The team server's MLflow app, ``mlflow server --app-name ablate-auth`` (an ``mlflow.app``
entry point): MLflow's basic-auth app with what a server shared by several members needs beyond
it. MLflow offers no setting for any of these, so they are hooks around its app:

- artifacts stay in the server's own store: an experiment is created at the server's proxied
  location only (``artifact_location`` is refused, whoever asks), and the server reads and
  writes artifacts only under its store, never through a symlink that leads out of it;
- a reader creates nothing (experiments, runs, logged or registered models, uploads): creating
  needs an editor's grants, an experiment or a registered model an editor of every experiment;
- only the admin lists users or looks up another user;
- a password is set only if long enough and not a common one; failed logins are limited
  (``ablate.server.logins``); a malformed ``Authorization`` header is a 401;
- an upload's body is at most ``ABLATE_SERVER_MAX_UPLOAD_MB`` (and states its length), any other
  request's at most ``DEFAULT_MAX_REQUEST_MB`` (or the upload limit, if lower), counted as it
  arrives where it states no length;
- ``/ablate/lr-study-storage`` names the port of the server's lr-study storage, without a
  password (``ablate.server.studies`` asks for the login).
"""

from __future__ import annotations

import base64
import binascii
import inspect
import json
import os
import re
from urllib.parse import urlparse

from ablate.server import local_admin, names
from ablate.server.logins import LoginFailures
from ablate.server.passwords import password_problem
from ablate.tracking.auth import STUDY_INFO_PATH

APP_NAME = "ablate-auth"
MAX_UPLOAD_ENV = "ABLATE_SERVER_MAX_UPLOAD_MB"
DEFAULT_MAX_UPLOAD_MB = 1024
# every other request (the JSON API, GraphQL): a log-batch of MLflow's own limits is ~1 MB
DEFAULT_MAX_REQUEST_MB = 64
LOGINS_ENV = "ABLATE_SERVER_LOGINS"  # the file that counts failed logins
# MLflow takes the Flask secret from its environment only, and its server process checks that it
# is set: the processes' environments (which their children inherit) hold this placeholder, and
# each worker reads the key from the file named by SECRET_FILE_ENV while its app is made
SECRET_IN_FILE, SECRET_FILE_ENV = "in-its-file", "ABLATE_SERVER_SECRET_FILE"
# the port of the lr-study storage (ablate.server.studies), which the app names at STUDY_INFO_PATH
STUDY_PORT_ENV = "ABLATE_SERVER_STUDY_PORT"


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def _confine_artifacts(root: str) -> None:
    """The server's artifact repositories: its store only, no symlink out of it."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import PERMISSION_DENIED
    from mlflow.server import handlers
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

    real_root = os.path.realpath(root)

    def refuse(what: str) -> MlflowException:
        return MlflowException(
            f"{what}: the server keeps artifacts in its own store only", PERMISSION_DENIED
        )

    class Confined(LocalArtifactRepository):
        def _check(self, path: str | None) -> None:
            target = os.path.join(self.artifact_dir, os.path.normpath(path or "."))
            if not _inside(os.path.realpath(target), real_root):
                raise refuse(f"artifact {path!r}")

    def checked(name: str, *params: str):
        method = getattr(LocalArtifactRepository, name)
        signature = inspect.signature(method)

        def call(self, *args, **kwargs):
            given = signature.bind(self, *args, **kwargs).arguments
            self._check(os.path.join(*(given.get(p) or "" for p in params)))
            return method(self, *args, **kwargs)

        setattr(Confined, name, call)

    # the arguments that name the path inside the repository, per method
    paths = {
        "get_local_path": ["artifact_path"],
        "list_artifacts": ["path"],
        "download_artifacts": ["artifact_path"],
        "_download_file": ["remote_file_path"],
        "delete_artifacts": ["artifact_path"],
        "log_artifact": ["artifact_path"],
        "log_artifacts": ["artifact_path"],
        "log_artifact_from_stream": ["artifact_path", "artifact_file_name"],
        "_get_or_create_artifact_dir": ["artifact_path"],  # every writer's folder
        "_get_destination_artifact_path": ["artifact_path", "artifact_file_name"],
    }
    for name, params in paths.items():
        checked(name, *params)

    def repository(uri: str, *args, **kwargs):
        parsed = urlparse(uri)
        if parsed.scheme == "mlflow-artifacts":
            local = os.path.join(root, parsed.path.lstrip("/"))
        elif parsed.scheme in ("", "file"):
            local = parsed.path if parsed.scheme else uri
        else:
            raise refuse(uri)
        if not _inside(os.path.realpath(local), real_root):
            raise refuse(uri)
        return Confined(local)

    # MLflow builds every repository its handlers serve through this one name
    handlers.get_artifact_repository = repository


def _json_error(status: int, code: str, message: str):
    from flask import make_response

    response = make_response(json.dumps({"error_code": code, "message": message}), status)
    response.headers["Content-Type"] = "application/json"
    return response


_PREFIX = re.compile(r"^/(?:ajax-)?api/[23]\.0/")
# MLflow's Assistant acts on the server's host as the server's user (its config names host folders,
# its skills install writes to any path, its agent runs a shell) and trusts any caller on the host
# itself, whatever the member's role: a team server answers none of its routes.
_ASSISTANT = re.compile(r"/(?:ajax-)?api/3\.0/mlflow/assistant(?:/|$)")
ASSISTANT_REFUSED = (
    "this team server runs no MLflow Assistant (it would act on the server's host with the "
    "server's rights): use it with make ui on your own machine"
)
# (route, method) that create something, and whether it needs an editor of every experiment
_CREATES = {
    ("mlflow/experiments/create", "POST"): True,
    ("mlflow/registered-models/create", "POST"): True,
    ("mlflow/runs/create", "POST"): False,
    ("mlflow/logged-models", "POST"): False,
    ("mlflow/model-versions/create", "POST"): False,
    ("mlflow/upload-artifact", "POST"): False,
}
_PASSWORD_ROUTES = {"mlflow/users/create", "mlflow/users/update-password", "mlflow/users/create-ui"}
_BODY_ROUTES = {"mlflow/experiments/create", "mlflow/runs/create", *_PASSWORD_ROUTES}


def grants(username: str, store=None) -> tuple[bool, set[tuple[str, str]]]:
    """(is admin, {(resource type, pattern)} the user may write) from the user store (MLflow's
    app's, unless ``store``)."""
    from mlflow.utils.workspace_utils import DEFAULT_WORKSPACE_NAME

    if store is None:
        from mlflow.server.auth import store
    user = store.get_user(username)
    if user.is_admin:
        return True, set()
    rows = store.list_grants(user.id, DEFAULT_WORKSPACE_NAME, {"experiment", "run"})
    return False, {
        (r.resource_type, r.resource_pattern) for r in rows if r.permission in ("EDIT", "MANAGE")
    }


def _json_body(request) -> dict:
    body = request.get_json(force=True, silent=True)
    if isinstance(body, str):  # MLflow takes a body posted double-encoded too
        try:
            body = json.loads(body)
        except ValueError:
            body = None
    return body if isinstance(body, dict) else {}


def _outside_location(body: dict) -> str | None:
    """The artifact location of the experiment a ``runs/create`` body names, where it lies
    outside the server's store (an experiment made before the server refused such locations)."""
    from mlflow.server.handlers import _get_tracking_store

    experiment = str(body.get("experiment_id") or body.get("experimentId") or "")
    if not experiment.isdigit():
        return None  # MLflow answers a missing or malformed id itself
    try:
        location = _get_tracking_store().get_experiment(experiment).artifact_location
    except Exception:  # no such experiment: MLflow's own 404
        return None
    return location if names.outside_store(location) else None


def _before_request():
    """After MLflow's own check (the user is known, and allowed by MLflow)."""
    from flask import g, request

    username = g.get("mlflow_authenticated_user")
    if username is None:  # a route open without a password
        return None
    route = _PREFIX.sub("", request.path)
    traces = "trace" in route and not route.startswith("mlflow-artifacts")
    # only the routes checked below read the body: an upload's stream is MLflow's to read
    body = _json_body(request) if route in _BODY_ROUTES or traces else {}
    if route == "mlflow/experiments/create" and names.requested_location(body):
        return _json_error(
            400,
            "INVALID_PARAMETER_VALUE",
            "artifact_location: this server keeps every experiment's artifacts in its own "
            "store; create the experiment without one",
        )
    if route == "mlflow/runs/create" and (where := _outside_location(body)):
        return _json_error(
            400,
            "INVALID_PARAMETER_VALUE",
            f"experiment {body.get('experiment_id')} keeps its artifacts at {where}, outside "
            "this server's store: log to an experiment the server created",
        )
    if traces and (bad := names.bad_trace_ids(request.args.to_dict(flat=False), body)):
        return _json_error(
            400, "INVALID_PARAMETER_VALUE", f"trace id {bad[0]!r}: a trace id is one plain name"
        )
    if route in _PASSWORD_ROUTES and request.method in ("POST", "PATCH"):
        password = body.get("password") or request.form.get("password") or ""
        name = body.get("username") or request.form.get("username") or ""
        if problem := password_problem(password, name):
            return _json_error(400, "INVALID_PARAMETER_VALUE", f"password: {problem}")
    if route in ("mlflow/users/list", "mlflow/users/get"):
        if route == "mlflow/users/get" and request.args.get("username") == username:
            return None
        if not grants(username)[0]:
            return _json_error(403, "PERMISSION_DENIED", "only the admin sees other users")
    needs_all = _CREATES.get((route, request.method))
    if needs_all is not None:
        admin, writes = grants(username)
        if not admin and (not writes or (needs_all and ("experiment", "*") not in writes)):
            what = "an editor of every experiment" if needs_all else "an editor"
            return _json_error(403, "PERMISSION_DENIED", f"creating this needs {what}")
    return None


class Guard:
    """The ASGI layer in front of MLflow's: the ``Authorization`` header's form, failed logins
    per user and per address, and the size of a request's body."""

    def __init__(
        self, app, max_body: int, logins: str = ":memory:", max_request: int | None = None
    ):
        self.app, self.max_body = app, max_body
        self.max_request = DEFAULT_MAX_REQUEST_MB * 2**20 if max_request is None else max_request
        self.failures = LoginFailures(logins)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"] == STUDY_INFO_PATH and scope["method"] == "GET":
            return await self._study_port(send)
        if _ASSISTANT.search(scope["path"]):
            return await _plain(send, 403, ASSISTANT_REFUSED)
        headers = dict(scope["headers"])
        login: tuple[str, str] | None = None
        if (header := headers.get(b"authorization")) is not None:
            user = _basic_user(header)
            if user is None:
                return await _plain(send, 401, "malformed Authorization header: use Basic auth")
            login = (user, (scope.get("client") or ("?",))[0])
            key = headers.get(local_admin.HEADER.lower().encode())
            local = local_admin.matches(key, os.environ.get(local_admin.DIGEST_ENV))
            if not local and (why := self.failures.blocked(*login)):
                return await _plain(send, 429, f"{why}: try again later")
        length = headers.get(b"content-length")
        if length is not None and not length.isdigit():
            return await _plain(send, 400, "bad Content-Length")
        upload = "artifact" in scope["path"]
        limit = self.max_body if upload else min(self.max_body, self.max_request)
        too_big = f"request body over {max(1, limit // 2**20)} MB (the server's limit)"
        if length is not None and int(length) > limit:
            return await _plain(send, 413, too_big)
        if length is None and scope["method"] in ("PUT", "POST") and upload:
            return await _plain(send, 411, "an upload states its length (Content-Length)")
        status: dict = {}
        received = [0]

        async def counted():
            # a body without a length (chunked) is counted as it arrives, and cut at the limit
            message = await receive()
            if message["type"] == "http.request":
                received[0] += len(message.get("body", b""))
                if received[0] > limit:
                    status["over"] = True
                    return {"type": "http.disconnect"}
            return message

        async def watch(message):
            if message["type"] == "http.response.start":
                if status.get("over"):
                    return  # the 413 below answers instead
                status["code"] = message["status"]
            if status.get("over"):
                return
            await send(message)

        try:
            await self.app(scope, receive if length is not None else counted, watch)
        except Exception:
            if not status.get("over"):
                raise
        if status.get("over") and "code" not in status:
            return await _plain(send, 413, too_big)
        if login and status.get("code") == 401:
            self.failures.failed(*login)

    async def _study_port(self, send) -> None:
        """Where the lr-study storage listens (``ablate.server.studies``): its port, which is
        no secret (the storage asks for the login), so that a member's client needs no setting."""
        port = os.environ.get(STUDY_PORT_ENV)
        if not port:
            return await _plain(send, 404, "this server keeps no lr studies")
        body = json.dumps({"port": int(port)}).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _basic_user(header: bytes) -> str | None:
    scheme, _, token = header.partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        user, colon, _ = base64.b64decode(token.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return user if colon and user else None


async def _plain(send, status: int, text: str) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8")]
    if status == 401:
        headers.append((b"www-authenticate", b'Basic realm="mlflow"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text.encode()})


def create_app():
    """MLflow's basic-auth app (under uvicorn, its FastAPI app) with ablate's guards."""
    from mlflow.server import ARTIFACTS_DESTINATION_ENV_VAR
    from mlflow.server import app as flask_app
    from mlflow.server.auth import create_app as basic_auth

    if root := os.environ.get(ARTIFACTS_DESTINATION_ENV_VAR):
        _confine_artifacts(root)
    key = "MLFLOW_FLASK_SERVER_SECRET_KEY"
    placeholder = os.environ.get(key)
    if secret := os.environ.get(SECRET_FILE_ENV):
        with open(secret) as f:
            os.environ[key] = f.read().strip()
    try:
        app = basic_auth(flask_app)  # the app keeps the key
    finally:
        if secret and placeholder is not None:  # not for the children the worker starts
            os.environ[key] = placeholder
    flask_app.before_request(_before_request)  # after MLflow's authentication and its check
    limit = int(os.environ.get(MAX_UPLOAD_ENV, DEFAULT_MAX_UPLOAD_MB)) * 2**20
    return Guard(app, limit, os.environ.get(LOGINS_ENV, ":memory:"))
