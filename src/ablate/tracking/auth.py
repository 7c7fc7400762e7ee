"""Credentials for a tracking server that asks for them, and the probe that tells a missing
server from a refused password before any training starts.

A client takes its user and password where MLflow looks: ``MLFLOW_TRACKING_USERNAME`` and
``MLFLOW_TRACKING_PASSWORD``, else MLflow's credentials file ``~/.mlflow/credentials``. The
files ``make server`` writes (the admin's, each member's: ``ablate.server.credentials``) use
that file's format, readable by their owner only.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

from ablate.errors import AblateError

ENV_USER, ENV_PASSWORD = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"
MLFLOW_FILE = "~/.mlflow/credentials"
# an authenticated endpoint that any user may call: a server with authentication answers 401
# to a missing or wrong password, and filters (never refuses) what the user may not read
_PROBE = "/api/2.0/mlflow/experiments/search"
# the team server's route, open without a password, that tells an lr study where the server's
# Optuna storage proxy listens (JSON {"port": ...}): the server answers it, a study asks it
STUDY_INFO_PATH = "/ablate/lr-study-storage"


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """``values`` in this process's environment inside the block (MLflow reads its settings
    from there at each request), the earlier ones back after it."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def as_user(username: str, password: str) -> contextlib.AbstractContextManager[None]:
    """MLflow's clients in this process authenticate as ``username`` inside the block."""
    return environ({ENV_USER: username, ENV_PASSWORD: password})


def get_once(uri: str, endpoint: str, timeout: float = 10, **params):
    """MLflow's own request (its credentials and TLS settings), tried once."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    return http_request(
        get_default_host_creds(uri),
        endpoint,
        "GET",
        max_retries=0,
        timeout=timeout,
        raise_on_status=False,
        params=params or None,
    )


def health(uri: str, timeout: float = 2.0) -> int | None:
    """The HTTP status of the server's health check, or None when nothing answers."""
    from mlflow.exceptions import MlflowException

    try:
        return get_once(uri, "/health", timeout).status_code
    except MlflowException:
        return None


def _reason(exc: Exception) -> str:
    """The socket's words from a failed request (requests nests them three deep)."""
    text = str(exc)
    found = re.search(r"\[Errno -?\d+\] [^\"')]+", text)
    if found:
        return found.group(0)
    return "timed out" if "timeout" in text.lower() else text


def _whose() -> str:
    """Where MLflow takes the credentials from, as a user would look for them."""
    from mlflow.utils.credentials import read_mlflow_creds

    user = read_mlflow_creds().username
    if os.environ.get(ENV_USER) or os.environ.get(ENV_PASSWORD):
        return f"user {user!r} ({ENV_USER}/{ENV_PASSWORD} in the environment)"
    return f"user {user!r} ({MLFLOW_FILE})"


def check_server(uri: str, timeout: float = 5.0) -> None:
    """One line, at once, when the server at ``uri`` is not there or refuses these credentials.

    MLflow's health check is open on a server with authentication, so an authenticated
    endpoint is asked as well: a wrong password is an error here, not a retry loop later.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.utils.credentials import read_mlflow_creds

    try:
        status = get_once(uri, "/health", timeout).status_code
        if status == 200:
            status = get_once(uri, _PROBE, timeout, max_results=1).status_code
    except MlflowException as exc:
        reason = _reason(exc)
        raise AblateError(f"tracking.uri={uri}: no MLflow server answers ({reason})") from None
    if status == 200:
        return
    creds = read_mlflow_creds()
    if status == 401 and not (creds.username and creds.password):
        raise AblateError(
            f"tracking.uri={uri}: the server asks for a user and password: set {ENV_USER} and "
            f"{ENV_PASSWORD}, or put them in {MLFLOW_FILE} (the file `make member` wrote)"
        )
    if status == 401:
        raise AblateError(
            f"tracking.uri={uri}: the server refused {_whose()}: wrong password or no such "
            f"member; fix {ENV_USER}/{ENV_PASSWORD} or {MLFLOW_FILE}, or ask the server's "
            f"admin (make member / make password)"
        )
    if status == 403:
        raise AblateError(
            f"tracking.uri={uri}: the server lets {_whose()} in but not read its experiments: "
            f"ask its admin (make member)"
        )
    raise AblateError(f"tracking.uri={uri}: server health check failed (HTTP {status})")
