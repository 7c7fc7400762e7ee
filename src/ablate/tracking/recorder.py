"""What training and its plugins record a run through: the interface ``ablate.tracking.run.Run``
implements for MLflow (a protocol, so that training, plugins and tests need no MLflow run)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Recorder(Protocol):
    """A run's record: tags, metrics (``step`` = epoch for per-epoch ones) and artifacts."""

    id: str  # the run's id (``runs:/<id>/...``)
    resumed: Any  # the earlier run this one continues (its tags name the checkpoint), or None

    def tags(self, tags: Mapping[str, Any]) -> None: ...

    def metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...

    def text(self, text: str, path: str) -> None: ...

    def json(self, obj: Any, path: str) -> None: ...

    def artifacts(self, folder: str, path: str) -> None: ...

    def model(self, folder: str, name: str) -> None:
        """The MLflow model saved in ``folder``: the run's logged model ``name``."""

    def heartbeat(self) -> None: ...

    def info(self, section: str, values: Mapping[str, Any]) -> None:
        """Bookkeeping kept out of the run page's tags (an artifact)."""

    def dataset(self, name: str, source: str, sha256: str, context: str) -> None:
        """A dataset the run used: name, where it comes from, content sha256, train/dev/test."""
