"""The speed switches, declared once each (``ablate.switches``): what the speed plugins
implement, with each one's default per device and what it does to results. Importing this module
declares them. Pure data: it loads nothing heavy."""

from __future__ import annotations

from ablate.switches import CHANGES, IDENTICAL, SAME_MATH, Switch, register

SPEED: list[Switch] = [
    Switch(
        "trainer.length_grouping",
        str,
        "pack",
        {"cpu": "pack", "cuda": "pack"},
        CHANGES,
        "how training batches are laid out: `pack` each random batch into fewer rows "
        "(block-diagonal attention, positions restart per window: the padded batch's loss and "
        "gradients); `split` each into sub-batches of similar length (the same); `bucket` "
        "batches of similar length (other batches: changes results); `off` padded batches",
        plugin="length_grouping",
        choices=("pack", "split", "bucket", "off"),
    ),
    Switch(
        "trainer.round_shapes",
        bool | None,
        None,
        {"cpu": "with bf16 or compile", "cuda": "with compile"},
        SAME_MATH,
        "training batches in few shapes (widths in multiples of 32), since oneDNN builds its bf16 "
        "kernels per shape and `torch.compile` compiles per shape; null = on for bf16 on a CPU "
        "and wherever `trainer.compile` is on",
        plugin="length_grouping",
    ),
    Switch(
        "trainer.fused_adamw",
        bool,
        True,
        {"cpu": True, "cuda": True},
        SAME_MATH,
        "AdamW as one fused kernel (the same update)",
        plugin="precision",
    ),
    Switch(
        "trainer.bf16",
        bool | None,
        None,
        {"cpu": False, "cuda": True},
        CHANGES,
        "bf16 autocast; null = on for a GPU that supports it, off on CPU (true needs AVX-512 BF16 "
        "or AMX)",
        plugin="precision",
    ),
    Switch(
        "trainer.tf32",
        bool,
        True,
        {"cpu": False, "cuda": True},
        CHANGES,
        "TF32 matrix products (GPU only)",
        plugin="precision",
    ),
    Switch(
        "trainer.pin_memory",
        bool,
        True,
        {"cpu": False, "cuda": True},
        IDENTICAL,
        "pinned host memory for batches (GPU only)",
        plugin="precision",
    ),
    Switch(
        "trainer.attention_kernels",
        bool,
        True,
        {"cpu": False, "cuda": True},
        SAME_MATH,
        "scaled-dot-product attention without cuDNN's kernel on CUDA (it built an execution plan "
        "at every call: bf16 training 6x slower); false = torch's own choice",
        plugin="precision",
        added=True,
    ),
    Switch(
        "trainer.compile",
        str,
        "off",
        {"cpu": "off", "cuda": "off"},
        SAME_MATH,
        "the model through `torch.compile` in this mode (`default`, `reduce-overhead`: CUDA "
        "graphs, `max-autotune`): fewer kernel launches a step, after a compile per batch shape "
        "(`round_shapes` keeps them few); `off` = eager. `gradual`, whose trainable blocks change "
        "each epoch, trains eagerly (the log says so)",
        plugin="precision",
        choices=("off", "default", "reduce-overhead", "max-autotune"),
        added=True,
    ),
    Switch(
        "trainer.cuda_graph",
        bool,
        False,
        {"cpu": False, "cuda": False},
        SAME_MATH,
        "the whole training step (forward, backward, clipping, AdamW) captured as one CUDA graph "
        "per batch shape and replayed, batches packed on the host into a few fixed shapes (the "
        "same update; other dropout masks); a model or strategy it cannot take trains eagerly "
        "(the log says why). GPU only",
        plugin="cuda_graph",
        added=True,
    ),
    Switch(
        "trainer.embedding_rows",
        bool,
        True,
        {"cpu": True, "cuda": True},
        SAME_MATH,
        "only the word-embedding rows the training data uses train, the others decay as AdamW "
        "would decay them (the same update, without a dense table gradient)",
        plugin="embedding_rows",
    ),
    Switch(
        "trainer.fast_dropout",
        bool,
        True,
        {"cpu": True, "cuda": False},
        SAME_MATH,
        "CPU dropout masks from int32 draws, 3x faster than bernoulli_ (the same distribution, "
        "other masks)",
        plugin="dropout",
    ),
    Switch(
        "trainer.sorted_eval",
        bool,
        True,
        {"cpu": True, "cuda": True},
        IDENTICAL,
        "dev/test sorted by length, cut into batches where padding plus a per-batch cost is "
        "least, under inference mode; predictions come back in dataset order",
        plugin="sorted_eval",
    ),
    Switch(
        "trainer.cache_frozen",
        bool,
        False,
        {"cpu": False, "cuda": False},
        CHANGES,
        "with the embeddings and blocks 0..k-1 frozen, their output is computed once per training "
        "window and training runs only blocks k.. (the prefix then has no dropout: changes "
        "results)",
        plugin="cache_frozen",
    ),
    Switch(
        "trainer.cache_frozen_eval",
        bool,
        True,
        {"cpu": True, "cuda": True},
        IDENTICAL,
        "the same for dev windows, kept from their first evaluation: later dev evaluations run "
        "only blocks k..",
        plugin="cache_frozen",
    ),
]

for _switch in SPEED:
    register(_switch)
