"""Strict command lines (``ablate.overrides``) and ``--help`` (``ablate.helptext``), through the
real CLI and real Hydra composition."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers.data import ROOT
from helpers.runs import refused_before_loading, run_cli, slice_overrides
from helpers.store import logged_runs

from ablate import config, helptext, overrides, switches
from ablate.cli import check_composed
from ablate.errors import AblateError
from ablate.lrstudy import cli as study_cli


def refused(proc: subprocess.CompletedProcess) -> str:
    """The one error line of a command refused before Hydra (exit status 2, no traceback)."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and not proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("ablate: error: ")
    return line


@pytest.mark.parametrize(
    ("override", "meant", "allowed"),
    [
        ("+trainer.lrr=1e-4", "'trainer.lr'", "Keys of trainer: epochs, lr, batch_size"),
        ("trainer.lrr=1e-4", "'trainer.lr'", "Keys of trainer: epochs, lr, batch_size"),
        ("traner.lr=1e-4", "'trainer.lr'", "Top-level keys and groups: data, experiment, freeze"),
        ("freeze=alternatin", "'alternating'", "Available options in 'freeze': adalora, all, alt,"),
    ],
)
def test_an_unknown_key_or_option_is_one_line_and_opens_nothing(tmp_path, override, meant, allowed):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    line = refused(run_cli(override, f"tracking.uri={store}", f"hydra.run.dir={tmp_path}/run"))
    assert override in line and f"did you mean {meant}" in line and allowed in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no store, no job folder


def test_a_sweep_with_an_unknown_option_fails_before_its_parent_run(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_cli(
        "--multirun", "freeze=none,alternatin", f"tracking.uri={store}",
        f"hydra.sweep.dir={tmp_path}/sweep",
    )  # fmt: skip
    line = refused(proc)
    assert "freeze has no option 'alternatin'; did you mean 'alternating'?" in line
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "sweep").exists()


def test_a_value_its_key_cannot_hold_is_one_line_and_opens_nothing(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    line = refused(
        run_cli("trainer.lr=abc", f"tracking.uri={store}", f"hydra.run.dir={tmp_path}/r")
    )
    assert "trainer.lr=abc: trainer.lr takes a number, not 'abc'" in line
    sweep = ["--multirun", "trainer.epochs=1,2.5", f"hydra.sweep.dir={tmp_path}/s"]
    line = refused(run_cli(*sweep, f"tracking.uri={store}"))  # every value of a sweep
    assert "trainer.epochs=1,2.5: trainer.epochs takes an integer, not 2.5" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    for given, said in [
        ("seed=null", "seed takes an integer, not null"),
        ("trainer.bf16=maybe", "trainer.bf16 takes true or false or null, not 'maybe'"),
    ]:
        with pytest.raises(AblateError, match=re.escape(said)):
            overrides.check([given])
    overrides.check(["trainer.lr=${oc.env:LR,1e-4}", "trainer.bf16=null", "seed=range(1,4)"])


def test_a_value_its_key_does_not_allow_is_one_line_before_any_job(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    where = [f"tracking.uri={store}", *(f"hydra.{k}.dir={tmp_path}/{k}" for k in ("run", "sweep"))]
    for given, said in [
        (["trainer.lr=-1"], "trainer.lr=-1: trainer.lr must be a positive number, not -1; "
                            "e.g. trainer.lr=5e-05, the default"),
        (["trainer.lr=0"], "trainer.lr=0: trainer.lr must be a positive number, not 0;"),
        (["trainer.epochs=0"], "trainer.epochs=0: trainer.epochs must be a positive integer, "
                               "not 0; e.g. trainer.epochs=5, the default"),
        (["--multirun", "trainer.lr=1e-4,0"], "trainer.lr=1e-4,0: trainer.lr must be a positive"),
    ]:  # fmt: skip
        assert said in refused(run_cli(*given, *where))
    # one an option's file sets: the composed config's, as fast
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "zero.yaml").write_text(
        "# @package _global_\ntrainer:\n  epochs: 0\n"
    )
    line = refused(run_cli("--config-dir", str(tmp_path / "conf"), "experiment=zero", *where))
    assert line == (
        "ablate: error: trainer.epochs=0: must be a positive integer; e.g. trainer.epochs=5, "
        "the default"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf"]  # no store, no job folder
    # answered before the training stack or MLflow loads
    proc = refused_before_loading("trainer.epochs=0", f"tracking.uri={store}")
    assert proc.stdout.splitlines() == ["2", "[]"], proc.stderr


def test_a_value_a_presets_grid_sweeps_and_its_key_refuses_is_one_line_before_loading(tmp_path):
    conf = tmp_path / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "grid.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params:\n      trainer.epochs: 0,1\n"
    )
    where = [f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"hydra.sweep.dir={tmp_path}/s"]
    proc = refused_before_loading(
        "--multirun", "--config-dir", str(conf), "experiment=grid", *where
    )
    assert proc.stdout.splitlines() == ["2", "[]"], proc.stderr
    assert proc.stderr.strip() == (
        "ablate: error: trainer.epochs=0,1: trainer.epochs must be a positive integer, not 0; "
        "e.g. trainer.epochs=5, the default (in the grid of experiment=grid: "
        "hydra.sweeper.params)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf"]  # no store, no sweep folder
    # the command line's own value of a key replaces the grid's; a single run has no grid
    check_composed(["experiment=grid", "trainer.epochs=1"], str(conf), "train", multirun=True)
    check_composed(["experiment=grid"], str(conf), "train")


def test_a_multiruns_cfg_shows_each_jobs_config_and_runs_nothing(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    given = ["trainer.lr=1e-4,2e-4", "seed=1", f"tracking.uri={store}"]
    proc = run_cli("--multirun", *given, f"hydra.sweep.dir={tmp_path}/s", "--cfg", "job")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    _, *parts = re.split(r"^# job #(\d+): (.*)$", proc.stdout, flags=re.M)
    jobs = list(zip(parts[0::3], parts[1::3], map(yaml.safe_load, parts[2::3]), strict=True))
    assert [(n, said.split()[0]) for n, said, _ in jobs] == [
        ("0", "trainer.lr=0.0001"),
        ("1", "trainer.lr=0.0002"),
    ]
    assert [(c["trainer"]["lr"], c["seed"], "hydra" in c) for *_, c in jobs] == [
        (1e-4, 1, False),
        (2e-4, 1, False),
    ]
    assert list(tmp_path.iterdir()) == []  # no store, no sweep folder
    # a preset's grid (hydra.sweeper.params) as its sweep runs it, with --cfg's own flags
    proc = run_cli("--multirun", "experiment=study", "--cfg", "job", "--package", "data")
    headers = re.findall(r"^# job #\d+: freeze=(\w+) data=(\w+)", proc.stdout, flags=re.M)
    assert len(headers) == 10 and headers[:2] == [("none", "naija"), ("none", "ewt")]
    assert proc.stdout.count("# @package data") == 10
    line = refused(run_cli("--multirun", "--run", "trainer.lr=1e-4"))
    assert line == (
        "ablate: error: --run and --multirun: give one of them (--multirun with --cfg shows "
        "each job's config)"
    )


def test_the_installed_script_checks_too(tmp_path):
    script = Path(sys.executable).parent / "ablate-train"
    assert script.is_file(), "pip install -e . installs the ablate-train script"
    proc = subprocess.run(
        [str(script), "+trainer.lrr=1e-4", f"tracking.uri=sqlite:///{tmp_path / 'm.db'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "did you mean 'trainer.lr'" in refused(proc)
    assert not (tmp_path / "m.db").exists()


@pytest.mark.parametrize(
    ("given", "found"),
    [
        (["+tracking.tags.a=b", "+tracking.tgs.a=b"], "tracking has no key 'tgs.a'"),
        (["hydra/launcher=joblb"], "did you mean 'joblib'?"),
        (["hydra/launchr=joblib"], "no config group 'hydra/launchr'; did you mean 'hydra/la"),
        (["freez=lora"], "'freez' is no config key; did you mean 'freeze'?"),
        (["~trainer.lrr"], "did you mean 'trainer.lr'?"),
        (["freeze=[lora,bitfit]", "data=nija,ewt"], "data has no option 'nija'"),
    ],
)
def test_check_names_the_bad_override_and_the_closest_names(given, found):
    with pytest.raises(AblateError) as err:
        overrides.check(given)
    assert found in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "given",
    [
        ["trainer.lr=3e-5", "seed=1,2,3", "seed=range(1,4)", "freeze=lora,bitfit,alt"],
        ["+tracking.tags.owner=me", "+model.config_overrides.hidden_size=64"],
        ["data.splits.train.file=x.conllu", "freeze.layers=[0,2]", "lr_study.freeze=[lora]"],
        ["hydra/launcher=joblib", "experiment=fair", "lr_study=trial"],
        ["model=tiny", "data=ud", "data.treebank=UD_Naija-NSC", "+tracking.tags={a: b}"],
        ["trainer.lr=tag(log,interval(1e-5,1e-3))", "~hydra.sweeper.params.seed"],
        ["freeze=glob(*)", "hydra.sweep.dir=/tmp/x", "++trainer.lr=1e-4"],
    ],
)
def test_valid_overrides_pass_the_check_and_compose(given):
    overrides.check(given)
    single = [g for g in given if "," not in g and "(" not in g and "hydra" not in g]
    config.compose(*single)  # Hydra agrees: these compose


def test_options_and_keys_of_a_search_path_and_an_extension(tmp_path):
    (tmp_path / "freeze").mkdir()
    (tmp_path / "freeze" / "mine.yaml").write_text("# Blocks 0..2 frozen, mine.\nname: mine\n"
                                                   "first: 3\n")  # fmt: skip
    path = f"hydra.searchpath=[file://{tmp_path}]"
    overrides.check([path, "freeze=mine,none"])
    with pytest.raises(AblateError, match="did you mean 'mine'"):
        overrides.check([path, "freeze=mien"])
    with pytest.raises(AblateError, match="freeze has no option 'mine'"):
        overrides.check(["freeze=mine"])
    text = helptext.render([path, "freeze=mine"])
    assert re.search(r"^  \* mine +Blocks 0\.\.2 frozen, mine\.$", text, re.M)
    assert "  freeze.first=3 " in text


# An extension's switch (docs/extending.md), without its plugin's code, which imports torch
EXTENSION = """from ablate import switches

switches.register(
    switches.Switch("trainer.flush_denormal", bool, False, {"cpu": False, "cuda": False},
                    switches.SAME_MATH, "flush denormal floats to zero", plugin="flush_denormal")
)
"""


def test_an_extensions_switch_is_a_key_and_its_typo_is_not(tmp_path):
    (tmp_path / "ablate_extensions").mkdir()
    (tmp_path / "ablate_extensions" / "flush_denormal.py").write_text(EXTENSION)
    shown = run_cli("trainer.flush_denormal=true", "--cfg", "job", cwd=tmp_path)
    assert shown.returncode == 0 and "  flush_denormal: true" in shown.stdout, shown.stderr
    line = refused(run_cli("+trainer.flush_denormall=true", cwd=tmp_path))
    assert "did you mean 'trainer.flush_denormal'?" in line
    assert "trainer.flush_denormal=false" in run_cli("--help", cwd=tmp_path).stdout


def test_a_declared_plus_key_still_trains_and_is_recorded(slice_root, tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_cli(
        *slice_overrides(slice_root, store, tmp_path), "trainer.epochs=1",
        "+tracking.tags.owner=me",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = logged_runs(store)
    assert run.info.status == "FINISHED" and run.data.tags["owner"] == "me"


def test_search_refuses_an_unknown_option_before_any_study(tmp_path, capsys):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"  # not made yet: nothing may make it
    assert study_cli.main(["freeze=lora,alternatin", f"tracking.uri={store}"]) == 2
    assert "did you mean 'alternating'?" in capsys.readouterr().err
    assert study_cli.main(["--report-only", "+trainer.lrr=1e-4", f"tracking.uri={store}"]) == 2
    assert "did you mean 'trainer.lr'?" in capsys.readouterr().err
    assert not Path(store.removeprefix("sqlite:///")).exists()


@pytest.fixture(scope="module")
def help_text() -> str:
    proc = run_cli("--help")
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return proc.stdout


def test_help_lists_every_group_option_and_key_with_its_doc(help_text):
    for folder in sorted(p for p in config.conf_dir().iterdir() if p.is_dir()):
        if folder.name in ("hydra", "local"):
            continue
        assert f"\n{folder.name}=\n" in help_text
        for option in folder.glob("*.yaml"):
            doc = overrides.first_comment(option.read_text())
            assert re.search(rf"^  [ *] {option.stem} +{re.escape(doc[:40])}", help_text, re.M)
    assert "  * none" in help_text and "  * naija" in help_text  # the composed choices
    assert "$MLFLOW_TRACKING_URI if set" in help_text  # a `$` survives Hydra's template
    for key, f in config.schema_keys():
        if key in switches.BY_KEY:
            assert f"{key}=" in help_text
        else:
            assert f"\n  {key}=" in help_text
            assert f.metadata["doc"].split()[0] in help_text
    assert "trainer.lr=5e-05" in help_text and "AdamW learning rate" in help_text
    assert "hydra/launcher=  basic, joblib" in help_text


def test_help_has_the_readme_examples_and_no_urls_or_checksums(help_text):
    usage = re.search(r"## Usage\n\n```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    there = [line for line in usage[1].splitlines() if line.startswith("python -m ablate.train")]
    section = help_text.split("== Examples (README.md) ==\n")[1].split("\n==")[0]
    here = [line.strip() for line in section.splitlines() if "python -m" in line]
    assert there and here == there
    assert not re.search(r"[0-9a-f]{64}", help_text) and not re.search("https?://", help_text)


def test_help_follows_the_command_line_and_keeps_hydras_flags():
    proc = run_cli("freeze=lora", "trainer.lr=3e-5", "--help")
    assert "  * lora " in proc.stdout and "\n  trainer.lr=3e-05 " in proc.stdout
    assert "Hydra" in run_cli("--hydra-help").stdout
    job = run_cli("--cfg", "job", "freeze=lora")
    assert job.returncode == 0 and "  name: lora" in job.stdout
    bad = refused(run_cli("trainer.epochs=five", "--help"))
    assert "trainer.epochs=five: trainer.epochs takes an integer, not 'five'" in bad


def test_help_is_as_quick_as_composing_and_loads_no_training_stack():
    def seconds(*args: str) -> float:
        start = time.perf_counter()
        assert run_cli(*args).returncode == 0
        return time.perf_counter() - start

    helps = [seconds("--help") for _ in range(2)]
    cfgs = [seconds("--cfg", "job") for _ in range(2)]
    assert min(helps) < 2 * min(cfgs), (helps, cfgs)
    proc = refused_before_loading("--help", modules=("torch", "transformers", "mlflow", "pandas"))
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stderr


def test_help_piped_into_a_reader_that_stops_early_ends_quietly():
    proc = subprocess.Popen(  # as `--help | head`: the reader gone before the text is written
        [sys.executable, "-m", "ablate.train", "--help"], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    proc.stdout.close()
    said = proc.stderr.read()
    assert proc.wait() == 0 and "Traceback" not in said and "BrokenPipe" not in said, said
