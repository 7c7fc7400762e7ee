"""What a member's request names that the server would turn into a place: an experiment's
artifact location, read as MLflow reads the request (``artifact_location`` or
``artifactLocation``, in a body posted once or double-encoded), and the trace ids a client
chooses, which become folders of the experiment's artifacts. Checked before MLflow's handler
runs (``ablate.server.app``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# where this server's experiments keep their artifacts: its own proxied store, by experiment id
STORE_LOCATION = re.compile(r"^mlflow-artifacts:/+\d+/?$")
# a trace id as MLflow makes them (tr-<hex>, or a v2 request id): one name, no path in it
TRACE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
TRACE_KEYS = ("trace_id", "request_id", "trace_ids", "request_ids")


def requested_location(body: Mapping) -> str:
    """The artifact location an ``experiments/create`` body asks for, as MLflow's handler parses
    it (protobuf's JSON reading takes ``artifactLocation`` too); "" for none."""
    from mlflow.protos.service_pb2 import CreateExperiment
    from mlflow.utils.proto_json_utils import parse_dict

    message = CreateExperiment()
    try:
        parse_dict(js_dict=dict(body), message=message)
    except Exception:  # MLflow refuses the same body itself, with its own error
        return str(body.get("artifact_location") or body.get("artifactLocation") or "")
    return message.artifact_location


def outside_store(location: str) -> bool:
    """Whether an experiment's artifact location lies outside the server's store."""
    return not STORE_LOCATION.match(location or "") or ".." in location


def _values(node: Any, keys: tuple[str, ...]) -> Iterable[str]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            wanted = key in keys or re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower() in keys
            if wanted and isinstance(value, str):
                yield value
            elif wanted and isinstance(value, list):
                yield from (v for v in value if isinstance(v, str))
            else:
                yield from _values(value, keys)
    elif isinstance(node, list):
        for item in node:
            yield from _values(item, keys)


def bad_trace_ids(args: Mapping[str, list[str]], body: Any) -> list[str]:
    """The trace ids in a request's query ``args`` (name -> values) or JSON ``body`` that are
    not one plain name (a ``/``, a ``..``): a trace's id names its artifacts' folder."""
    found = [v for key in TRACE_KEYS for v in args.get(key, [])]
    found += list(_values(body, TRACE_KEYS))
    return [v for v in found if not TRACE_ID.match(v) or ".." in v]
