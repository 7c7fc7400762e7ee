"""The switches and the plugin interface: every switch declared once, claimed by one plugin and
in the schema; its identity and comparability flags; the TrainingArguments the numeric switches
set; the order check of plugins that read what another adds."""

from __future__ import annotations

import pytest
from helpers.data import ROOT
from helpers.runs import compose_cfg
from helpers.speed import compose
from omegaconf import OmegaConf

from ablate import config, plugins, switches
from ablate.errors import AblateError
from ablate.speed import precision
from ablate.tracking.identity import identity


def test_every_switch_is_declared_once_claimed_by_one_plugin_and_in_the_schema():
    claimed = [key for p in plugins.active() for key in p.switches]
    assert len(claimed) == len(set(claimed))
    core = {s.key for s in switches.SWITCHES if s.plugin == switches.CORE}
    assert core == {"trainer.measure_flops", "data.tokenized_cache", "data.tokenized_cache_dir"}
    assert sorted([*claimed, *core]) == sorted(s.key for s in switches.SWITCHES)
    for each in plugins.active():
        assert {switches.BY_KEY[key].plugin for key in each.switches} <= {each.name}
    cfg = compose_cfg()
    # each default is declared once, with its switch: the recipe's file restates none
    recipe = OmegaConf.load(ROOT / "conf" / "trainer" / "default.yaml")
    assert not {s.name for s in switches.in_group("trainer")} & set(recipe), recipe
    for s in switches.SWITCHES:
        assert s.results in switches.RESULTS, s.key
        assert set(s.devices) == set(switches.DEVICES), s.key
        assert OmegaConf.select(cfg, s.key) == s.default, s.key  # the schema's default
        assert config.flags("identity")[s.key] == s.in_identity
        assert config.flags("setting")[s.key] == (s.results == switches.CHANGES)
    # the per-device defaults are what the plugins do
    gpu = precision.arguments(cfg.trainer, cuda=True, bf16_ok=True, tf32_ok=True)
    cpu = precision.arguments(cfg.trainer, cuda=False, bf16_ok=True, tf32_ok=False)
    for key, kwarg in (("trainer.bf16", "bf16"), ("trainer.pin_memory", "dataloader_pin_memory")):
        assert gpu[kwarg] is switches.BY_KEY[key].devices["cuda"]
        assert cpu[kwarg] is switches.BY_KEY[key].devices["cpu"]
    assert "torch_compile" not in gpu and "torch_compile" not in cpu  # compile: off everywhere


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune"])
def test_compile_hands_its_mode_to_the_trainer_and_refuses_another(mode):
    from ablate.training.arguments import training_arguments
    from ablate.training.prepare import check_switches

    cfg = compose_cfg(f"trainer.compile={mode}")
    fields = precision.arguments(cfg.trainer, cuda=False, bf16_ok=False, tf32_ok=False)
    args = training_arguments(cfg, "unused", "cpu", **fields)
    assert args.torch_compile is True
    assert args.torch_compile_mode == (None if mode == "default" else mode)
    with pytest.raises(AblateError, match=r"trainer\.compile='fast' is not one of off, default"):
        check_switches(compose_cfg("trainer.compile=fast"))


def test_identity_leaves_out_identical_switches_and_new_keys_at_their_default():
    base = compose()
    same = compose(
        "trainer.sorted_eval=false",
        "trainer.cache_frozen_eval=false",
        "data.tokenized_cache=false",
        "trainer.pin_memory=false",
    )
    assert identity(base) == identity(same)
    assert identity(base) != identity(compose("trainer.cache_frozen=true"))
    assert identity(base) != identity(compose("trainer.fused_adamw=false"))  # other bits
    # a key added later counts only when set away from its default
    added = [s.key for s in switches.SWITCHES if s.added]
    assert added
    for key in added:
        value = switches.BY_KEY[key].default
        assert identity(base) != identity(compose(f"{key}={str(not value).lower()}"))


def test_gpu_and_cpu_training_arguments():
    t = compose().trainer
    gpu = precision.arguments(t, cuda=True, bf16_ok=True, tf32_ok=True)
    assert gpu == {
        "optim": "adamw_torch_fused",
        "bf16": True,
        "dataloader_pin_memory": True,
        "tf32": True,
    }
    cpu = precision.arguments(t, cuda=False, bf16_ok=True, tf32_ok=False)
    assert cpu["bf16"] is False and "tf32" not in cpu and cpu["dataloader_pin_memory"] is False
    opt_in = compose("trainer.bf16=true").trainer
    assert precision.arguments(opt_in, cuda=False, bf16_ok=True, tf32_ok=False)["bf16"] is True
    with pytest.raises(AblateError, match=r"trainer\.bf16=true: this CPU"):
        precision.arguments(opt_in, cuda=False, bf16_ok=False, tf32_ok=False)
    off = compose("trainer.fused_adamw=false", "trainer.tf32=false", "trainer.bf16=false").trainer
    gpu_off = precision.arguments(off, cuda=True, bf16_ok=True, tf32_ok=True)
    assert gpu_off["optim"] == "adamw_torch" and not gpu_off["bf16"] and "tf32" not in gpu_off


def test_a_plugin_that_reads_what_a_later_one_adds_is_refused():
    class Reads(plugins.Plugin):
        name, uses = "reads", ("model.extra",)

    class Adds(plugins.Plugin):
        name, provides = "adds", ("model.extra",)

    plugins.check_order([Adds(), Reads()])  # the provider first: fine
    plugins.check_order([Reads()])  # nothing adds it: the reader does without
    with pytest.raises(ValueError, match="'reads' reads 'model.extra', which plugin 'adds' adds"):
        plugins.check_order([Reads(), Adds()])
    with pytest.raises(ValueError, match="'adds' and 'adds' both add 'model.extra'"):
        plugins.check_order([Adds(), Adds()])
    # the built-in order holds: the prefix cache adds what length grouping reads
    names = [p.name for p in plugins.active()]
    assert names.index("cache_frozen") < names.index("length_grouping")
