"""Whether this user may start a run in an experiment of a tracking server with authentication,
asked before any data or model loads: a reader's run is one line, not a 403 after loading.

The server resolves the permission itself (MLflow's ``users/permissions/get``, the same path its
runtime check takes), so nothing of its rules is repeated here.
"""

from __future__ import annotations

from ablate.errors import AblateError
from ablate.tracking.auth import get_once

_CURRENT = "/api/2.0/mlflow/users/current"  # any signed-in user: its name and whether admin
_PERMISSION = "/api/3.0/mlflow/users/permissions/get"  # a user may ask about itself
_BY_NAME = "/api/2.0/mlflow/experiments/get-by-name"
_FIX = "ask the server's admin to make it an editor (make member NAME={user} ROLE=editor)"
# (uri, experiment, user) that passed in this process: a sweep prepares its store once and each
# job again (twice with skip_finished), and each check asks the server 3-4 requests. Only a pass
# is kept: a refusal ends the command, and the server itself refuses a write revoked since.
_passed: set[tuple[str, str, str | None]] = set()


def _permission(uri: str, user: str, kind: str, resource: str) -> str:
    resp = get_once(uri, _PERMISSION, username=user, resource_type=kind, resource_id=resource)
    if resp.status_code != 200:
        raise AblateError(
            f"tracking.uri={uri}: the server would not say what user {user!r} may do "
            f"(HTTP {resp.status_code} from {_PERMISSION})"
        )
    return resp.json()["permission"]


def check_can_run(uri: str, experiment: str) -> None:
    """One line when the user signed in to the server at ``uri`` may not create and write runs
    in ``experiment`` (one not created yet: any user may create it, but a reader still writes no
    run there). A server without authentication passes."""
    if not uri.startswith(("http://", "https://")):
        return
    from mlflow.utils.credentials import read_mlflow_creds

    key = (uri, experiment, read_mlflow_creds().username)
    if key not in _passed:
        _check(uri, experiment)
        _passed.add(key)


def _check(uri: str, experiment: str) -> None:
    current = get_once(uri, _CURRENT)
    if current.status_code == 404:  # no auth app: every client may write
        return
    if current.status_code != 200:
        return  # check_server has said what is wrong with the credentials
    me = current.json()["user"]
    if me.get("is_admin"):
        return
    user = me["username"]
    # A grant on every run (``make member`` gives one) decides what a run's record may hold;
    # without one MLflow falls back on the experiment's permission
    runs = _permission(uri, user, "run", "*")
    if runs not in ("NO_PERMISSIONS", "EDIT", "MANAGE"):
        raise AblateError(
            f"tracking.uri={uri}: user {user!r} holds {runs} on runs and cannot start a run in "
            f"experiment {experiment!r}, which needs an editor; " + _FIX.format(user=user)
        )
    found = get_once(uri, _BY_NAME, experiment_name=experiment)
    if found.status_code == 404:  # not created yet: its creator will manage it
        return
    held = "NO_PERMISSIONS"  # 403: the server hides an experiment not granted
    if found.status_code == 200:
        experiment_id = found.json()["experiment"]["experiment_id"]
        held = _permission(uri, user, "experiment", experiment_id)
    if held not in ("EDIT", "MANAGE"):
        what = "no access to" if held in ("NO_PERMISSIONS", "DENY") else f"{held} on"
        raise AblateError(
            f"tracking.uri={uri}: user {user!r} holds {what} experiment {experiment!r} and "
            f"cannot start a run in it, which needs an editor (EDIT); " + _FIX.format(user=user)
        )
