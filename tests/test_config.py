"""Hydra composition: every option composes, the recipe defaults, and bad overrides fail early."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.data import ROOT
from helpers.runs import run_cli
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from ablate import config

GROUPS = ("data", "model", "freeze", "trainer", "tracking", "experiment", "lr_study")


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (config.conf_dir() / group).glob("*.yaml"))


def make(overrides: list[str] = (), hydra: bool = False):
    return config.compose(*overrides, hydra=hydra)


CASES = [(g, o) for g in GROUPS for o in options(g)]


@pytest.mark.parametrize(("group", "option"), CASES, ids=[f"{g}={o}" for g, o in CASES])
def test_every_group_option_composes_and_resolves(group, option):
    extra = ["data.treebank=UD_Naija-NSC"] if (group, option) == ("data", "ud") else []
    cfg = make([f"{group}={option}", *extra], hydra=group in ("experiment", "lr_study"))
    job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    resolved = OmegaConf.to_container(job, resolve=True, throw_on_missing=True)
    assert set(resolved) >= {"data", "model", "freeze", "trainer", "tracking", "seed"}
    if group in ("data", "model", "freeze"):
        expected = {"alternating": "alt", "ud": "UD_Naija-NSC"}.get(option, option)
        assert resolved[group]["name"] == expected


def test_core_groups_have_their_options():
    assert {"naija", "ewt", "ud"} <= set(options("data"))
    assert {"minilm", "distilbert_multilingual", "tiny"} <= set(options("model"))
    assert {"none", "all", "first2", "first4", "alt", "last2"} <= set(options("freeze"))


def test_defaults_are_the_earlier_study_recipe_on_minilm():
    cfg = make()
    assert (cfg.data.name, cfg.model.name, cfg.freeze.name) == ("naija", "minilm", "none")
    t = cfg.trainer
    assert (t.epochs, t.lr, t.batch_size, t.weight_decay, t.warmup_ratio) == (5, 5e-5, 16, 0.01, 0)
    assert cfg.seed == 42
    assert cfg.data.lowercase is True and cfg.data.max_length == 128
    assert cfg.data.max_train_sentences is None
    assert cfg.freeze.embeddings is False
    assert Path(cfg.model.name_or_path, "config.json").is_file()  # the packaged MiniLM


def test_the_paper_preset_is_the_study_grid_with_three_seeds_and_resumable():
    cfg = make(["experiment=paper"], hydra=True)
    params = cfg.hydra.sweeper.params
    assert params.freeze.split(",") == ["none", "all", "first2", "first4", "alt"]
    assert params.data.split(",") == ["naija", "ewt"]
    assert params.seed.split(",") == ["1", "2", "3"]
    t = cfg.trainer
    assert (cfg.model.name, t.epochs, t.lr, t.batch_size) == ("minilm", 5, 5e-5, 16)
    assert cfg.skip_finished is True  # a rerun continues the grid
    assert cfg.tracking.experiment == "paper"


def test_tracking_uri_defaults_to_absolute_sqlite_at_project_root(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert make().tracking.uri == f"sqlite:///{ROOT / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////elsewhere/m.db")
    assert make().tracking.uri == "sqlite:////elsewhere/m.db"
    assert make(["tracking.uri=http://127.0.0.1:5005"]).tracking.uri == "http://127.0.0.1:5005"


def test_the_stores_a_checkout_writes_by_default_are_git_ignored(monkeypatch):
    from ablate.lrstudy.storage import storage_url

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = make()
    stores = [cfg.tracking.uri, storage_url(cfg)]  # the runs', and the lr studies' beside it
    paths = [Path(s.removeprefix("sqlite:///")) for s in stores]
    assert [p.parent for p in paths] == [ROOT, ROOT] and paths[1].name == "lr_study.db"
    files = [str(p.relative_to(ROOT)) for p in paths] + [f"{p.name}.lock" for p in paths]
    proc = subprocess.run(["git", "check-ignore", *files], cwd=ROOT, capture_output=True, text=True)
    assert proc.stdout.split() == files, proc.stderr


def test_data_root_is_the_command_line_then_env_then_this_machine_then_the_user_cache(
    monkeypatch, tmp_path
):
    monkeypatch.setenv("ABLATE_DATA_DIR", str(tmp_path))
    assert make().data.root == str(tmp_path)  # conf/local/ (if any) defers to the environment
    assert make(["data.root=/elsewhere"]).data.root == "/elsewhere"
    monkeypatch.delenv("ABLATE_DATA_DIR")
    local = ROOT / "conf" / "local" / "default.yaml"
    if local.is_file():  # make setup wrote it: the data folder beside the checkout
        assert make().data.root == str(ROOT.parent / "shared" / "data")
    assert config.default_data_root() == str(config.user_cache())
    assert config.default_data_root().endswith("ablate")


def test_make_setup_points_conf_local_at_the_data_beside_the_checkout(tmp_path, monkeypatch):
    checkout = tmp_path / "checkout"
    (tmp_path / "shared" / "data" / "ud").mkdir(parents=True)
    checkout.mkdir()
    (checkout / "Makefile").write_text((ROOT / "Makefile").read_text())
    proc = subprocess.run(
        ["make", "-C", str(checkout), "conf/local/default.yaml"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    written = OmegaConf.load(checkout / "conf" / "local" / "default.yaml")
    monkeypatch.delenv("ABLATE_DATA_DIR", raising=False)
    assert written.data.root == str(tmp_path / "shared" / "data")
    monkeypatch.setenv("ABLATE_DATA_DIR", "/from/env")
    assert written.data.root == "/from/env"  # an explicit environment wins


def test_unknown_group_option_names_the_allowed_values():
    with pytest.raises(ConfigCompositionException) as err:
        make(["freeze=frist2"])
    message = str(err.value)
    for allowed in ("first2", "first4", "alt", "none", "all", "last2"):
        assert allowed in message


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("trainer.lrr=1e-4", "lrr"),
        ("trainer.epochs=five", "epochs"),
        ("data.lowercase=maybe", "lowercase"),
    ],
)
def test_misspelt_key_or_wrong_type_fails_at_composition(override, needle):
    with pytest.raises(ConfigCompositionException) as err:
        make([override])
    assert needle in str(err.value) + str(err.value.__cause__)


def test_misspelt_key_in_a_group_file_fails(tmp_path):
    (tmp_path / "freeze").mkdir()
    (tmp_path / "freeze" / "mine.yaml").write_text("name: mine\nfirts: 2\n")
    with pytest.raises(ConfigCompositionException) as err:
        make(["freeze=mine", f"hydra.searchpath=[file://{tmp_path}]"])
    assert "firts" in str(err.value) + str(err.value.__cause__)


def test_cli_bad_option_exits_nonzero_listing_allowed_values(tmp_path):
    proc = run_cli("freeze=frist2", f"hydra.run.dir={tmp_path}")
    assert proc.returncode != 0
    assert "Available options in 'freeze'" in proc.stderr and "first4" in proc.stderr


def test_config_loads_no_strategy_until_the_schema_is_read_and_then_holds_their_keys():
    # config sits below the strategies: they declare the freeze keys (ablate.freeze_keys) and
    # the schema imports them by name when first built, without torch (--help builds it too)
    probe = (
        "import sys\nimport ablate.config as c\n"
        "print(sorted(m for m in sys.modules if m.startswith('ablate.strategies')))\n"
        "keys = dict(c.schema_keys())\n"
        "print(sorted({'torch', 'transformers'} & set(sys.modules)), 'freeze.r' in keys)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert proc.stdout.splitlines() == ["[]", "[] True"], proc.stderr
