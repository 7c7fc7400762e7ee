"""Finding dataset files, and fetching the pinned ones (``conf/data``)."""

from __future__ import annotations

import difflib
import functools
import logging
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ablate import config
from ablate.config import DataCore, user_cache
from ablate.errors import AblateError
from ablate.fileio import sha256_file
from ablate.pinned import interpolated

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")
# This machine's settings file, which `make setup` writes (the Makefile's LOCAL) and
# conf/train.yaml loads as `optional local: default`; errors tell users to set data.root there.
LOCAL_SETTINGS = "conf/local/default.yaml"
EXAMPLE_TREEBANK = "UD_Naija-NSC"  # what an error naming a missing data.treebank suggests


@dataclass(frozen=True)
class SplitFiles:
    """Located split files with their sha256."""

    paths: dict[str, Path]
    sha256: dict[str, str]


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file's bytes; read once per process while its size and mtime stay (a job
    hashes its data and model files for its identity and again for the run's record)."""
    stat = Path(path).stat()
    return _sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    return sha256_file(path)


class DownloadFailed(AblateError):
    """A download that did not complete (network error); ``reason`` says why, briefly."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def fetch(url: str, sha256: str | None, dest: Path, hint: str | None = None) -> Path:
    """Download ``url`` to ``dest`` with a progress bar, keeping it only if its sha256 matches.

    pooch downloads to a temporary file and moves it into place only after the hash check,
    so a failed or corrupt download leaves no file behind. ``hint`` (where to put the file by
    hand) ends the error message of a failed download.
    """
    import pooch

    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        pooch.retrieve(
            url,
            known_hash=f"sha256:{sha256}" if sha256 else None,
            fname=dest.name,
            path=dest.parent,
            progressbar=True,
        )
    except ValueError as exc:  # pooch's hash mismatch
        raise AblateError(
            f"{url}: downloaded file failed its sha256 check ({exc}); not kept"
        ) from exc
    except Exception as exc:  # network errors come in many types (requests, OSError, ...)
        hint = hint or f"Put the file at {dest} yourself"
        reason = f"{type(exc).__name__}: {str(exc)[:120]}"
        raise DownloadFailed(f"could not download {url} ({reason}). {hint}", reason) from exc
    return dest


def _set_root(data: DataCore) -> str:
    """How to point ``data.root`` at this dataset's files: the advice every data error ends with."""
    return (
        f"set data.root to a folder holding {data.dir}/ (in {LOCAL_SETTINGS}, which `make setup` "
        f"writes; with ABLATE_DATA_DIR; or on the command line)"
    )


def _missing(data: DataCore, folder: Path, files: list[str], why: str) -> str:
    """The one error of missing data: which files, where, and the two ways to provide them."""
    return (
        f"data={data.name}: {', '.join(files)} not in {folder}, and {why}. Provide them: (1) "
        f"{_set_root(data)}, or (2) run once with internet access to "
        f"download them into {folder}"
    )


def _check_root(data: DataCore) -> None:
    """A ``data.root`` that is not a folder is an error, before anything is created there; only
    the user cache, where downloads go by default, may be created by a download."""
    root = Path(data.root)
    if root.is_dir() or root.resolve() == user_cache().resolve():
        return
    what = "is not a folder" if root.exists() else "does not exist"
    create = ""
    if not root.exists() and data.splits and any(spec.url for spec in data.splits.values()):
        create = f", or create it to download {data.name} into it"
    raise AblateError(f"data.root={data.root} {what} (data={data.name}): {_set_root(data)}{create}")


def _check_inputs(data: DataCore) -> None:
    """A key that the option's folder interpolates (``dir: ud/${.treebank}``) and that the command
    line must set (``option_input``) is named when unset, with the folders it may name: not
    ``data.dir=ud/None``."""
    node = data if isinstance(data, DictConfig) else OmegaConf.structured(data)
    folder = str(OmegaConf.to_container(node, resolve=False).get("dir") or "")
    inputs = config.flags("option_input")
    for key in sorted(interpolated(f"dir: {folder}", "data")):
        if not inputs.get(f"data.{key}") or node.get(key) is not None:
            continue
        parent = Path(data.root) / folder.partition("${")[0]
        there = sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []
        example = EXAMPLE_TREEBANK if EXAMPLE_TREEBANK in there or not there else there[0]
        found = f"there: {', '.join(there)}" if there else "none there yet, or set data.root"
        raise AblateError(
            f"data.{key} is missing (this data option's folder is {folder}): name a folder of "
            f"{parent}, e.g. data.{key}={example} ({found})"
        )


def _no_folder(data: DataCore, folder: Path) -> str:
    """The error of a dataset folder missing under an existing root: the folders that are there,
    and the close one."""
    treebank = bool(data.get("treebank"))
    key, value = ("data.treebank", data.treebank) if treebank else ("data.dir", data.dir)
    parent = folder.parent
    there = sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []
    if not there:
        return (
            f"{key}={value}: no folder {folder}, and no dataset folders in {parent}; "
            f"{_set_root(data)}"
        )
    hint = ""
    for close in difflib.get_close_matches(folder.name, there, n=1, cutoff=0.6):
        hint = f"; did you mean {key}={close if treebank else Path(data.dir).parent / close}?"
    kind = "Treebanks" if treebank else "Folders"
    return f"{key}={value}: no folder {folder}. {kind} in {parent}: {', '.join(there)}{hint}"


def check_folders(data: DataCore) -> None:
    """Refuse a ``data.root`` that is not a folder, and the folder of an unpinned dataset (one
    found by the UD naming pattern) that is not there, and a key its option names the folder by
    left unset (``data=ud`` without ``data.treebank``): only paths are looked at, so the command
    line answers before anything heavy is imported (``ablate.cli``)."""
    _check_inputs(data)
    _check_root(data)
    folder = Path(data.root) / data.dir
    if not data.splits and not folder.is_dir():
        raise AblateError(_no_folder(data, folder))


def file_splits(data: DataCore) -> tuple[str, ...]:
    """The splits read from files: all three, or train and dev when ``data.test_from_train``
    holds the test set out of train (a dataset whose published test split has no labels)."""
    return SPLITS if data.get("test_from_train") is None else ("train", "dev")


def locate(data: DataCore) -> SplitFiles:
    """Find (and, for pinned releases, download and verify) the split files of the dataset
    (``file_splits``)."""
    folder = Path(data.root) / data.dir
    paths: dict[str, Path] = {}
    needed = file_splits(data)
    check_folders(data)
    if data.splits:
        for split in needed:
            if split not in data.splits:
                raise AblateError(f"data.splits of '{data.name}' has no '{split}' entry")
        for split in needed:
            spec = data.splits[split]
            path = folder / spec.file
            if not path.is_file():
                missing = [
                    data.splits[s].file
                    for s in needed
                    if not (folder / data.splits[s].file).is_file()
                ]
                if not spec.url:
                    raise AblateError(
                        _missing(data, folder, missing, f"data.splits.{split}.url is not set")
                    )
                log.info("downloading %s -> %s", spec.url, path)
                try:
                    fetch(spec.url, spec.sha256, path)
                except DownloadFailed as exc:
                    why = f"downloading them failed ({exc.reason})"
                    raise AblateError(_missing(data, folder, missing, why)) from None
            paths[split] = path
    else:
        for split in needed:
            found = sorted(folder.glob(f"*-ud-{split}.conllu"))
            if len(found) != 1:
                raise AblateError(
                    f"{folder}: expected exactly one *-ud-{split}.conllu file, found "
                    f"{len(found)} ({', '.join(p.name for p in found) or 'none'})"
                )
            paths[split] = found[0]
    sha = {split: sha256_of(path) for split, path in paths.items()}
    for split, path in paths.items():
        pinned = data.splits[split].sha256 if data.splits else None
        if pinned and sha[split] != pinned:
            release = f"{data.name} r{data.version}" if data.get("version") else data.name
            raise AblateError(
                f"{path}: sha256 {sha[split]} differs from the pinned {pinned} of {release}; use "
                f"the published file (data.splits.{split}.url), or set "
                f"data.splits.{split}.sha256=null to use this one"
            )
    return SplitFiles(paths=paths, sha256=sha)


def extra_test_paths(data: DataCore) -> list[Path]:
    """The ``data.extra_test`` files: each absolute, or relative to the working directory or to
    ``data.root``; a missing one is an error."""
    paths = []
    for given in data.extra_test or []:
        path = Path(given).expanduser()
        if not path.is_absolute() and not path.is_file():
            path = Path(data.root) / path
        if not path.is_file():
            raise AblateError(
                f"data.extra_test: {given}: no such file (give it absolute, or relative to the "
                f"working directory or to data.root={data.root})"
            )
        paths.append(path)
    return paths
