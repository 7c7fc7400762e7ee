"""A run's identity: equal configurations (on equal data and model files) have equal identity,
so ``skip_finished`` finds a grid's finished jobs and ``trainer.resume`` the killed one.

Which keys count is derived from the schema's flags (``ablate.config.key``), and for the speed
switches from their registry: where a run goes and how it is scheduled (``identity=False``) and
switches whose results are identical to the last digit are left out.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping

from omegaconf import OmegaConf

from ablate import config
from ablate.data.files import extra_test_paths, locate, sha256_of
from ablate.errors import AblateError
from ablate.models.source import source_fingerprint


def left_out(cfg: config.TrainCore) -> list[str]:
    """The dotted keys of ``cfg`` that its identity leaves out: those not part of any identity,
    and keys added since identities were first recorded while they keep their default."""
    out = []
    for dotted, f in config.schema_keys():
        added = f.metadata.get("added") and OmegaConf.select(cfg, dotted) == config.key_default(f)
        if added or not f.metadata.get("identity", True):
            out.append(dotted)
    return out


def identity(cfg: config.TrainCore, data_sha256: Mapping[str, str] | None = None) -> str:
    """sha256 of the resolved config without the keys ``left_out`` names, plus the sha256 of each
    data split file (``data_sha256``, else located now) and ``data.extra_test`` file.

    ``data.root`` is left out and the files' content counts instead: the same files elsewhere are
    the same run, and other files under the same config (an unpinned treebank folder, a user's
    slice) are not. Likewise a local model folder counts by its content (``source_fingerprint``),
    not its path. The caches and the evaluation order are left out because they give the same
    numbers (tested).
    """
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["model"]["name_or_path"] = source_fingerprint(cfg.model)
    with contextlib.suppress(AblateError):  # the run raises it again, before it is opened
        extra = enumerate(extra_test_paths(cfg.data))
        resolved["data_sha256"] = {
            **(data_sha256 if data_sha256 is not None else locate(cfg.data).sha256),
            **{f"extra_test.{i}": sha256_of(path) for i, path in extra},
        }
    for dotted in left_out(cfg):
        *parents, leaf = dotted.split(".")
        node = resolved
        for key in parents:
            node = node.get(key, {})
        node.pop(leaf, None)
    for group in config.GROUPS:  # a group all of whose keys are left out is left out whole
        if resolved.get(group) == {} and OmegaConf.select(cfg, group):
            resolved.pop(group)
    return hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str).encode()).hexdigest()
