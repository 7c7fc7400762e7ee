"""Where an lr study persists and how it is opened: the Optuna storage a config names (a
database of its own, or an ablate team server's through ``ablate.lrstudy.remote``), the study's
name, and its seeded sampler. Apart from ``ablate.lrstudy.study``'s trial loop: a trial's own
process (``ablate.lrstudy.pruning``) opens the same storage and needs nothing else."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import os
import socket
import time
import uuid
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
from filelock import FileLock
from omegaconf import OmegaConf, open_dict

from ablate.config import key_default, schema_keys
from ablate.errors import AblateError
from ablate.lrstudy import pruner, remote
from ablate.lrstudy.seed import seed
from ablate.tracking.identity import identity

if TYPE_CHECKING:
    from ablate.config import TrainCore

# a study process on another host is dead after GRACE_S silent (the team server's storage too)
HEARTBEAT_S, GRACE_S = remote.HEARTBEAT_S, remote.GRACE_S
# A new study's set-up on a storage without a lock (``_elected``): the study attr naming the
# worker that does it, how long a claim settles, how often the others look, and when a claim
# that set nothing up is taken over (seeding takes seconds)
SETTING_UP = "ablate.setting_up"
ELECT_S, POLL_S, STALE_S = 2.0, 1.0, 300.0

log = logging.getLogger(__name__)


def storage_url(cfg: TrainCore) -> str:
    """Where the study persists: ``lr_study.storage``, else ``lr_study.db`` beside a sqlite
    tracking store (or a local folder one), else the storage an ablate team server at an http(s)
    tracking URI serves (``grpc://host:port``, ``ablate.lrstudy.remote``)."""
    if cfg.lr_study.storage:
        return cfg.lr_study.storage
    uri = cfg.tracking.uri
    if uri.startswith("sqlite:///"):
        return f"sqlite:///{Path(uri.removeprefix('sqlite:///')).parent / 'lr_study.db'}"
    if "://" not in uri or uri.startswith("file:"):
        return f"sqlite:///{Path(uri.removeprefix('file:')).resolve().parent / 'lr_study.db'}"
    why = "not a tracking server's address"
    if uri.startswith(("http://", "https://")):
        try:
            return remote.discover(uri)
        except AblateError as exc:
            why = str(exc)
    raise AblateError(
        f"tracking.uri={uri}: an lr study needs a database of its own beside a tracking server "
        f"({why}): set lr_study.storage (e.g. lr_study.storage=postgresql://user@host/optuna, or "
        "sqlite:////shared/disk/lr_study.db)"
    )


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """The storage at ``url`` (a database, or a team server's ``grpc://``), with the heartbeats
    that fail a dead study process's trial and queue it again."""
    with warnings.catch_warnings():  # heartbeat arguments: experimental, in Optuna 2 to 5
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = optuna.storages.RetryHeartbeatStaleTrialCallback(
            max_retry=3, inherit_intermediate_values=True
        )
        if url.startswith(remote.SCHEME):
            storage = remote.TeamStorage(url, retry)
            storage.check()
            return storage
        kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
        return optuna.storages.RDBStorage(
            url,
            engine_kwargs=kwargs,
            heartbeat_interval=HEARTBEAT_S,
            grace_period=GRACE_S,
            heartbeat_stale_trial_callback=retry,
        )


def study_name(cfg: TrainCore) -> str:
    """The study tag plus a digest of the trials' settings (lr aside) and the configured range.
    Keys whose runs compare as one setting (``setting=False``: a worker's threads, its eval
    batch) are taken at their defaults, so workers that differ only there join one study."""
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.trainer.lr = 0.0
        for dotted, f in schema_keys():
            meta = f.metadata
            # the model's folder: its identity counts the files' content, not the path
            if (
                meta.get("identity", True)
                and not meta.get("setting", True)
                and (dotted != "model.name_or_path")
            ):
                OmegaConf.update(cfg, dotted, key_default(f), merge=False)
    digest = hashlib.sha256(f"{identity(cfg)} {list(cfg.lr_study.range)}".encode()).hexdigest()
    return f"{cfg.tracking.tags.study}-{digest[:8]}"


def open_study(cfg: TrainCore) -> optuna.Study:
    """The study of ``cfg``'s trials, with the pruner of ``lr_study``; created if new, and then
    seeded from its trials' runs in the tracking store (``ablate.lrstudy.seed``)."""
    name = study_name(cfg)
    url = storage_url(cfg)
    lock, locked = contextlib.nullcontext(), url.startswith("sqlite:///")
    if locked:
        path = Path(url.removeprefix("sqlite:///"))
        path.parent.mkdir(parents=True, exist_ok=True)
        # workers starting together would each create a fresh file's tables ("table
        # alembic_version already exists"): sqlite serialises writes, not Optuna's migrations
        lock = FileLock(f"{path}.lock", timeout=300)
    with lock, warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = open_storage(url)
        study = optuna.create_study(
            storage=storage,
            study_name=name,
            direction="maximize",
            sampler=sampler(name, cfg),
            pruner=pruner(cfg.lr_study),
            load_if_exists=True,
        )
        # new here (or its seeding killed): its trials' runs may be, after an archive's import
        # (``seed``); one worker sets it up: inside the sqlite lock, else the one the others elect
        if "range" not in study.user_attrs and (locked or _elected(study)):
            seed(study, cfg)
    return study


def _elected(study: optuna.Study) -> bool:
    """Whether this worker sets up ``study`` (no ``range`` yet) on a storage without a lock
    (PostgreSQL, a team server's); False once another one has. Optuna's storages have neither a
    lock nor a compare-and-set, so the workers elect one: each that finds the study new and no
    one setting it up writes its token into the study's ``SETTING_UP`` attr, waits ``ELECT_S``
    and goes on only if its token is still there (the last to write). The others wait for the
    range, and take over from a worker that holds it ``STALE_S`` without setting it up (killed
    while it seeded)."""
    token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    holder, since, said = None, time.monotonic(), None
    while "range" not in (attrs := study.user_attrs):
        held = attrs.get(SETTING_UP)
        if held != holder:  # someone new holds it (or no one): its time starts now
            holder, since = held, time.monotonic()
        if held is None or time.monotonic() - since > STALE_S:
            study.set_user_attr(SETTING_UP, token)
            time.sleep(ELECT_S)
            if study.user_attrs.get(SETTING_UP) == token:
                return "range" not in study.user_attrs
            continue
        if said != held:
            log.info("lr study %s: worker %s sets it up; waiting", study.study_name, held)
            said = held
        time.sleep(POLL_S)
    return False


def sampler(name: str, cfg: TrainCore, number: int = 0) -> optuna.samplers.TPESampler:
    """TPE seeded by the study's name, ``seed`` and the trial's number: each study draws its own
    lrs, and two workers asking at once draw different ones (one seed would give both the
    same); half of ``lr_study.trials`` are its random start-up."""
    seed = int(hashlib.sha256(f"{name} {cfg.seed} {number}".encode()).hexdigest()[:8], 16)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(1, cfg.lr_study.trials // 2))
