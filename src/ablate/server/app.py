"""The team server's MLflow app, ``mlflow server --app-name ablate-auth`` (an ``mlflow.app``
entry point): MLflow's basic-auth app with what a server shared by several members needs beyond
it. MLflow offers no setting for any of these, so they are hooks around its app:

- artifacts stay in the server's own store: an experiment is created at the server's proxied
  location only (``artifact_location`` is refused, whoever asks), and the server reads and
  writes artifacts only under its store, never through a symlink that leads out of it;
- a reader creates nothing (experiments, runs, logged or registered models, uploads): creating
  needs an editor's grants, an experiment or a registered model an editor of every experiment;
- only the admin lists users or looks up another user;
- a password is set only if long enough and not a common one; failed logins are limited per
  user name and per client address; a malformed ``Authorization`` header is a 401;
- a request body is at most ``ABLATE_SERVER_MAX_UPLOAD_MB`` (an upload states its length);
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
import sqlite3
import threading
import time
from urllib.parse import urlparse

APP_NAME = "ablate-auth"
MAX_UPLOAD_ENV = "ABLATE_SERVER_MAX_UPLOAD_MB"
DEFAULT_MAX_UPLOAD_MB = 1024
MIN_PASSWORD = 12
LOGINS_ENV = "ABLATE_SERVER_LOGINS"  # the file that counts failed logins
# the port of the lr-study storage (ablate.server.studies), and where the app names it
STUDY_PORT_ENV, STUDY_INFO_PATH = "ABLATE_SERVER_STUDY_PORT", "/ablate/lr-study-storage"
# failed logins in a window after which a user name, or a client address, is refused until
# the window has passed
LOGIN_LIMITS, LOGIN_WINDOW_S = {"user": 10, "address": 30}, 300

# The most used passwords' words (as in the public top lists), without the digits and signs
# people append: no offline breach list ships with the project's libraries, so this short list
# and the patterns in ``password_problem`` stand in for one.
_WORDS = """password passwort passw0rd p@ssword p@ssw0rd qwerty qwertz azerty qwertyuiop asdfgh
    asdfghjkl zxcvbnm letmein welcome admin administrator root iloveyou monkey dragon football
    baseball soccer hockey sunshine princess trustno1 abc abcd abcdef abcdefg master login
    superman batman starwars whatever shadow secret changeme default mlflow ablate test tester
    testing guest user hello freedom flower summer winter spring autumn computer internet
    michael jennifer jordan charlie thomas daniel access mustang killer pokemon"""
_COMMON_WORDS = frozenset(_WORDS.split())
_TRAILING = re.compile(r"[\d\W_]+$")
_LEADING = re.compile(r"^[\d\W_]+")


def password_problem(password: str, username: str = "") -> str | None:
    """Why ``password`` may not be set (None: it may): too short, a common word with digits or
    signs around it, few distinct characters, a run of keys or digits, or the user's name (of
    3 characters or more)."""
    if len(password) < MIN_PASSWORD:
        return f"a password needs at least {MIN_PASSWORD} characters"
    low = password.lower()
    core = _LEADING.sub("", _TRAILING.sub("", low))
    sequences = ("0123456789", "1234567890", "abcdefghijklmnopqrstuvwxyz", "qwertyuiopasdfghjkl")
    if (
        core in _COMMON_WORDS
        or not core
        or len(set(low)) < 5
        or any(low in s * 2 for s in sequences)
        or (len(username) >= 3 and username.lower() in low)
    ):
        return "this password is too common or too easy to guess: choose another"
    return None


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
_BODY_ROUTES = {"mlflow/experiments/create", *_PASSWORD_ROUTES}


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


def _before_request():
    """After MLflow's own check (the user is known, and allowed by MLflow)."""
    from flask import g, request

    username = g.get("mlflow_authenticated_user")
    if username is None:  # a route open without a password
        return None
    route = _PREFIX.sub("", request.path)
    # only the routes checked below read the body: an upload's stream is MLflow's to read
    body = _json_body(request) if route in _BODY_ROUTES else {}
    if route == "mlflow/experiments/create" and body.get("artifact_location"):
        return _json_error(
            400,
            "INVALID_PARAMETER_VALUE",
            "artifact_location: this server keeps every experiment's artifacts in its own "
            "store; create the experiment without one",
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


class LoginFailures:
    """Failed logins of the last ``LOGIN_WINDOW_S``, per user name and per client address, in
    a SQLite file that the server's workers share. (Flask-Limiter and ``limits`` count in one
    process, or in a Redis or memcached service: the server has two workers and no such
    service.)"""

    def __init__(self, path: str):
        self.db = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
        self.lock = threading.Lock()
        with self.lock:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("CREATE TABLE IF NOT EXISTS failures (kind TEXT, key TEXT, at REAL)")
            self.db.execute("CREATE INDEX IF NOT EXISTS by_key ON failures (kind, key, at)")

    def blocked(self, keys: dict[str, str]) -> str | None:
        """The kind (user or address) of ``keys`` that failed too often lately, or None."""
        since = time.time() - LOGIN_WINDOW_S
        with self.lock:
            for kind, key in keys.items():
                (count,) = self.db.execute(
                    "SELECT count(*) FROM failures WHERE kind = ? AND key = ? AND at > ?",
                    (kind, key, since),
                ).fetchone()
                if count >= LOGIN_LIMITS[kind]:
                    return kind
        return None

    def failed(self, keys: dict[str, str]) -> None:
        now = time.time()
        with self.lock:
            self.db.executemany(
                "INSERT INTO failures VALUES (?, ?, ?)", [(k, v, now) for k, v in keys.items()]
            )
            self.db.execute("DELETE FROM failures WHERE at < ?", (now - LOGIN_WINDOW_S,))


class Guard:
    """The ASGI layer in front of MLflow's: the ``Authorization`` header's form, failed logins
    per user and per address, and the size of a request's body."""

    def __init__(self, app, max_body: int, logins: str = ":memory:"):
        self.app, self.max_body = app, max_body
        self.failures = LoginFailures(logins)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"] == STUDY_INFO_PATH and scope["method"] == "GET":
            return await self._study_port(send)
        if _ASSISTANT.search(scope["path"]):
            return await _plain(send, 403, ASSISTANT_REFUSED)
        headers = dict(scope["headers"])
        keys: dict[str, str] = {}
        if (header := headers.get(b"authorization")) is not None:
            user = _basic_user(header)
            if user is None:
                return await _plain(send, 401, "malformed Authorization header: use Basic auth")
            keys = {"user": user, "address": (scope.get("client") or ("?",))[0]}
            if kind := self.failures.blocked(keys):
                return await _plain(
                    send, 429, f"too many failed logins for this {kind}: try again later"
                )
        length = headers.get(b"content-length")
        if length is not None and not length.isdigit():
            return await _plain(send, 400, "bad Content-Length")
        if length is not None and int(length) > self.max_body:
            return await _plain(
                send, 413, f"request body over {self.max_body // 2**20} MB (the server's limit)"
            )
        if length is None and scope["method"] in ("PUT", "POST") and "artifact" in scope["path"]:
            return await _plain(send, 411, "an upload states its length (Content-Length)")
        status = {}

        async def watch(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        await self.app(scope, receive, watch)
        if keys and status.get("code") == 401:
            self.failures.failed(keys)

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
    app = basic_auth(flask_app)
    flask_app.before_request(_before_request)  # after MLflow's authentication and its check
    limit = int(os.environ.get(MAX_UPLOAD_ENV, DEFAULT_MAX_UPLOAD_MB)) * 2**20
    return Guard(app, limit, os.environ.get(LOGINS_ENV, ":memory:"))
