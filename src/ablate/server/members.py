"""The team server's members, managed with the admin's credentials through MLflow's auth client.

The server's default permission is none: a member sees only the experiments granted to it
(every experiment, unless ``--experiments`` names some). A **reader** reads them; an **editor**
also writes runs into them and deletes runs (ablate deletes a KILLED run that starts over and a
sweep that recorded nothing, which MLflow's EDIT does not allow, so an editor holds MANAGE on
runs). A member's password is generated into ``.server/members/<name>.credentials``, in MLflow's
credentials-file format, for the admin to hand over.

MLflow without workspaces lets every user create an experiment of its own (its creator manages
it); a reader holds READ on every run, so it cannot write a run's record even there.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from ablate.errors import AblateError
from ablate.server.credentials import new_password, read_credentials, write_credentials
from ablate.server.files import CREDENTIALS, local_uri
from ablate.server.local_admin import local_admin
from ablate.tracking.auth import as_user

MEMBERS = "members"
# role -> (its permission on each granted experiment, its permission on every run / model
# of an experiment it reads)
ROLES = {
    "reader": ("READ", {"run": "READ", "logged_model": "READ"}),
    "editor": ("EDIT", {"run": "MANAGE"}),
}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_LIST = "/api/3.0/mlflow/users/permissions/list"


def member_file(folder: Path, name: str) -> Path:
    """Where a member's credentials are written."""
    return folder / MEMBERS / f"{name}.credentials"


def _admin(folder: Path) -> tuple[str, tuple[str, str]]:
    path = folder / CREDENTIALS
    if not path.is_file():
        raise AblateError(f"{path} not found: start the server with authentication (make server)")
    return local_uri(folder), read_credentials(path)


class _Users:
    """The user endpoints of MLflow's basic-auth app, called as MLflow's own client calls them
    (``mlflow.server.auth.client``, whose import loads the whole server app and its warnings)."""

    def __init__(self, uri: str):
        self.uri = uri

    def _call(self, method: str, endpoint: str, **kwargs) -> None:
        from mlflow.utils.credentials import get_default_host_creds
        from mlflow.utils.rest_utils import http_request, verify_rest_response

        resp = http_request(get_default_host_creds(self.uri), endpoint, method, **kwargs)
        verify_rest_response(resp, endpoint)

    def get_user(self, name: str) -> None:
        self._call("GET", "/api/2.0/mlflow/users/get", params={"username": name})

    def create_user(self, name: str, password: str) -> None:
        self._call(
            "POST", "/api/2.0/mlflow/users/create", json={"username": name, "password": password}
        )

    def update_user_password(self, name: str, password: str, current_password=None) -> None:
        body = {"username": name, "password": password}
        if current_password is not None:
            body["current_password"] = current_password
        self._call("PATCH", "/api/2.0/mlflow/users/update-password", json=body)

    def grant_user_permission(self, name: str, kind: str, pattern: str, level: str) -> None:
        self._call(
            "POST",
            "/api/3.0/mlflow/users/permissions/grant",
            json={
                "username": name,
                "resource_type": kind,
                "resource_id": pattern,
                "permission": level,
            },
        )

    def revoke_user_permission(self, name: str, kind: str, pattern: str) -> None:
        body = {"username": name, "resource_type": kind, "resource_id": pattern}
        self._call("POST", "/api/3.0/mlflow/users/permissions/revoke", json=body)


def _client(uri: str) -> _Users:
    return _Users(uri)


def _refused(exc: Exception, what: str) -> AblateError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return AblateError(f"{what}: the server refused ({first})")


def _exists(client, name: str) -> bool:
    from mlflow.exceptions import RestException

    try:
        client.get_user(name)
    except RestException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return False
        raise
    return True


def _grants(uri: str, name: str) -> list[dict]:
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request_safe

    resp = http_request_safe(get_default_host_creds(uri), _LIST, "GET", params={"username": name})
    return resp.json().get("permissions", [])


def _experiment_ids(uri: str, names: list[str]) -> list[str]:
    """Ids of the named experiments, created (as the model-training kind) where missing."""
    from mlflow.tracking import MlflowClient

    from ablate.tracking.store import KIND

    client, ids = MlflowClient(tracking_uri=uri), []
    for name in names:
        exp = client.get_experiment_by_name(name)
        ids.append(exp.experiment_id if exp else client.create_experiment(name, tags=KIND))
    return ids


def set_member(folder: Path, name: str, role: str, experiments: list[str] = ()) -> Path | None:
    """Make ``name`` a ``role`` of ``experiments`` (every experiment when empty), replacing the
    grants an earlier call gave it. A new member gets a password, written to the file returned
    (None for a member that exists: its password stays)."""
    if role not in ROLES:
        raise AblateError(f"role {role!r}: choose one of {', '.join(sorted(ROLES))}")
    if not _NAME.fullmatch(name):
        raise AblateError(f"member name {name!r}: letters, digits and . _ @ - only")
    from mlflow.exceptions import MlflowException

    uri, admin = _admin(folder)
    if name == admin[0]:
        raise AblateError(f"{name!r} is the server's admin: it holds every permission already")
    level, tiers = ROLES[role]
    created = None
    with as_user(*admin), local_admin(folder):
        client = _client(uri)
        try:
            if _exists(client, name):
                for grant in _grants(uri, name):  # ours; an experiment it created stays its own
                    kind, pattern = grant["resource_type"], grant["resource_pattern"]
                    if (kind in ("run", "logged_model") and pattern == "*") or (
                        kind == "experiment" and grant["permission"] in ("READ", "EDIT")
                    ):
                        client.revoke_user_permission(name, kind, pattern)
            else:
                password = new_password(name)
                client.create_user(name, password)
                created = member_file(folder, name)
                write_credentials(created, name, password)
            for experiment in _experiment_ids(uri, list(experiments)) if experiments else ["*"]:
                client.grant_user_permission(name, "experiment", experiment, level)
            for kind, permission in tiers.items():
                client.grant_user_permission(name, kind, "*", permission)
        except MlflowException as exc:
            raise _refused(exc, f"member {name}") from None
    return created


def new_password_for(folder: Path, name: str) -> Path:
    """A new password for member ``name`` (or the admin), written to its credentials file,
    which is returned."""
    from mlflow.exceptions import MlflowException

    uri, (admin, admin_password) = _admin(folder)
    password = new_password(name)
    with as_user(admin, admin_password), local_admin(folder):
        client = _client(uri)
        try:
            if name == admin:
                client.update_user_password(name, password, current_password=admin_password)
            elif not _exists(client, name):
                raise AblateError(f"no member {name!r}: add it with make member NAME={name}")
            else:
                client.update_user_password(name, password)
        except MlflowException as exc:
            raise _refused(exc, f"password of {name}") from None
    path = folder / CREDENTIALS if name == admin else member_file(folder, name)
    write_credentials(path, name, password)
    return path


def main(args: argparse.Namespace) -> str:
    """``member`` and ``password`` of ``python -m ablate.server``: what to tell."""
    folder = args.dir.resolve()
    if args.action == "password":
        path = new_password_for(folder, args.name)
        return f"{args.name}: a new password is in {path} (the old one is refused within a minute)"
    names = [e for e in args.experiments.split(",") if e]
    created = set_member(folder, args.name, args.role, names)
    scope = f"experiments {', '.join(names)}" if names else "every experiment"
    role = f"an {args.role}" if args.role[0] in "aeiou" else f"a {args.role}"
    if created is None:
        return f"{args.name} is now {role} of {scope} (its password is unchanged)"
    return (
        f"{args.name} is {role} of {scope}; its password is in {created}: hand the file "
        f"over privately; {args.name} saves it as ~/.mlflow/credentials (or exports "
        f"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD)"
    )
