"""``python benchmarks/gpu_step.py probe|step|concurrent SPEC.json``: the measurements of
``bench_gpu.py``'s phases A0, A2 and A3, each in its own process, its result written to the
spec's ``out`` as a JSON file.

- ``probe`` (A0): versions, the kernels bf16 attention (``scaled_dot_product_attention``) runs
  with cuDNN's attention on and off, read from ``torch.profiler``; each of ``imports`` imported
  twice in a fresh Python (the first pays a cold file cache, where it is cold), the last of
  them once more under ``-X importtime``: its import time by top-level package.
- ``step`` (A2): a bare training step (forward, backward, fused AdamW) of each model's shape,
  random weights built from its config, one fixed batch with no padding: eager, and the whole
  step captured as one CUDA graph (``torch.cuda.CUDAGraph``, AdamW ``capturable=True``, static
  input tensors), in fp32 with TF32 and in bf16 (autocast): ms per step and the capture's ms.
- ``concurrent`` (A3): for each count in ``processes``, that many processes each running the
  bare eager step for ``seconds`` at once: their steps per second, summed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

BATCH, LENGTH, LABELS = 16, 64, 17  # the recipes' batch; a typical Naija length; UPOS tags


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def build(folder: str, device: str, shape: tuple[int, int] = (BATCH, LENGTH)):
    """A token classifier with random weights from ``folder``'s config, and a fixed batch of
    ``shape`` (batch, length)."""
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(folder, num_labels=LABELS)
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_config(config).to(device).train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, config.vocab_size, tuple(shape), generator=g)
    labels = torch.randint(0, LABELS, tuple(shape), generator=g)
    # no attention_mask: a full batch needs none, and building one reads it on the host
    return model, {"input_ids": ids.to(device), "labels": labels.to(device)}


def _precision(dtype: str, device: str):
    """The autocast of ``dtype`` (bf16), else (``tf32``, ``fp32``) a no-op, with TF32 matmuls
    on CUDA."""
    import contextlib

    import torch

    if dtype == "bf16":  # no autocast cache: a captured graph may not hold one
        return torch.autocast(device, dtype=torch.bfloat16, cache_enabled=False)
    torch.set_float32_matmul_precision("high" if device == "cuda" else "highest")
    torch.backends.cudnn.allow_tf32 = device == "cuda"
    return contextlib.nullcontext()


def eager(folder: str, dtype: str, device: str, steps: int, warmup: int, shape) -> dict:
    """ms per bare eager step after ``warmup`` steps, over ``steps`` steps."""
    import torch

    model, batch = build(folder, device, shape)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)

    def step() -> None:
        with _precision(dtype, device):
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return {"ms_per_step": 1e3 * (time.perf_counter() - t0) / steps, "steps": steps}


def graphed(folder: str, dtype: str, device: str, steps: int, warmup: int, shape) -> dict | str:
    """ms per replay of the whole step captured as one CUDA graph, and the capture's ms; or
    why it could not be measured."""
    if device != "cuda":
        return "not available on cpu"
    import torch

    model, batch = build(folder, device, shape)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True, capturable=True)

    def step():
        with _precision(dtype, device):
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        return loss

    try:
        side = torch.cuda.Stream()  # warm-up on a side stream, as torch's docs capture
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(max(3, warmup)):
                opt.zero_grad(set_to_none=True)
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)  # backward allocates the grads in the graph's pool
        _sync(device)
        t0 = time.perf_counter()
        with torch.cuda.graph(graph):
            step()
        _sync(device)
        capture_ms = 1e3 * (time.perf_counter() - t0)
        for _ in range(warmup):
            graph.replay()
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            graph.replay()
        _sync(device)
    except Exception as exc:  # the table says why the graph has no number
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"failed: {type(exc).__name__}: {first[:200]}"
    ms = 1e3 * (time.perf_counter() - t0) / steps
    return {"ms_per_step": ms, "capture_ms": capture_ms, "steps": steps}


def attention_kernels(device: str) -> dict:
    """The kernels (CUDA) or ops (CPU) one bf16 ``scaled_dot_product_attention`` call runs as a
    training step's would (inputs that need grads, dropout 0.1), without and with a padding
    mask, with cuDNN's attention on (torch's default) and off."""
    import torch
    import torch.nn.functional as F
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if device == "cuda" else [])]
    q = torch.randn(BATCH, 12, LENGTH, 32, device=device, dtype=torch.bfloat16)
    q.requires_grad_(True)
    pad = torch.ones(BATCH, 1, 1, LENGTH, dtype=torch.bool, device=device)
    pad[: BATCH // 2, ..., LENGTH // 2 :] = False  # half the rows padded to half the length
    found = {}
    for cudnn in (True, False):
        if device == "cuda":
            torch.backends.cuda.enable_cudnn_sdp(cudnn)
        for mask in (None, pad):

            def call(mask=mask):
                return F.scaled_dot_product_attention(q, q, q, attn_mask=mask, dropout_p=0.1)

            call()  # its first call's set-up, unprofiled
            _sync(device)
            with profile(activities=activities) as prof:
                call()
                _sync(device)
            kind = DeviceType.CUDA if device == "cuda" else DeviceType.CPU
            names = {e.name for e in prof.events() if e.device_type == kind}
            if device != "cuda":
                names = {n for n in names if "scaled_dot_product" in n or "attention" in n}
            key = f"cuDNN {'on' if cudnn else 'off'}" + (
                ", padding mask" if mask is not None else ""
            )
            found[key] = sorted(names)
    if device == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(True)
    return found


def import_times(modules: list[str], env: dict | None = None) -> dict:
    """Seconds to import each module in a fresh Python, twice: ``cold`` then ``warm``."""
    times = {}
    for module in modules:
        runs = []
        for _ in range(2):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", f"import {module}"], check=True, env=env)
            runs.append(time.perf_counter() - t0)
        times[module] = {"cold_s": runs[0], "warm_s": runs[1]}
    return times


def import_packages(module: str, env: dict | None = None) -> dict[str, float]:
    """Seconds of ``module``'s import in a fresh Python spent in each top-level package (the
    modules' own times, ``-X importtime``, summed by package), the slowest first."""
    cmd = [sys.executable, "-X", "importtime", "-c", f"import {module}"]
    err = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True).stderr
    spent: dict[str, float] = {}
    for line in err.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[0].strip().isdigit():  # self us | cumulative us | name
            package = parts[2].strip().split(".")[0]
            spent[package] = spent.get(package, 0.0) + int(parts[0]) / 1e6
    return dict(sorted(spent.items(), key=lambda kv: -kv[1]))


def platform() -> dict:
    """The device's name and the versions of torch, CUDA and transformers."""
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(0) if cuda else "CPU",
    }


def probe(spec: dict) -> dict:
    """Phase A0: versions, the attention kernels, import times."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return {
        **platform(),
        "attention": attention_kernels(device),
        "imports": import_times(spec["imports"]),
        "import_packages": import_packages(spec["imports"][-1]),
    }


def bare_steps(spec: dict, save) -> dict:
    """Phase A2: per model and precision, the eager step and the graphed one (``save``d after
    each)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = {}
    for name, folder in spec["models"].items():
        for dtype in ("tf32", "bf16"):
            n, w, shape = spec["steps"], spec["warmup"], spec["shape"]
            out[f"{name}/{dtype}"] = {
                "eager": eager(folder, dtype, device, n, w, shape),
                "graph": graphed(folder, dtype, device, n, w, shape),
            }
            save(out)
            if device == "cuda":
                torch.cuda.empty_cache()
    return out


def loop(spec: dict) -> None:
    """One A3 process, number ``index``: warm up, say so; then in each round whose count is
    above its index, wait for the round's start and step for ``seconds``."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(spec["threads"])
    model, batch = build(spec["model"], device, spec["shape"])
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)

    def step() -> None:
        with _precision(spec["dtype"], device):
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)

    for _ in range(2):  # CUDA's set-up and the first kernels
        step()
    folder, i = Path(spec["folder"]), spec["index"]
    (folder / f"ready-{i}").touch()
    for count in spec["processes"]:
        if i >= count:
            continue
        while not (folder / f"go-{count}").exists():
            time.sleep(0.005)
        t0, steps = time.perf_counter(), 0
        while time.perf_counter() - t0 < spec["seconds"]:
            step()
            steps += 1
        done = {"steps": steps, "seconds": time.perf_counter() - t0}
        tmp = folder / f"out-{count}-{i}.tmp"
        tmp.write_text(json.dumps(done))
        tmp.replace(folder / f"out-{count}-{i}.json")  # whole, once its name appears


def concurrent(spec: dict, folder: Path, save) -> dict:
    """Phase A3: the most ``processes`` asked for started and warmed up once; then per count,
    that many of them stepping at once: their steps per second, summed (``save``d after each
    count)."""
    most, out = max(spec["processes"]), {}
    threads = max(1, spec["cpus"] // most)
    procs = []
    for i in range(most):
        path = folder / f"a3-spec-{i}.json"
        path.write_text(json.dumps({**spec, "index": i, "folder": str(folder), "threads": threads}))
        procs.append(subprocess.Popen([sys.executable, __file__, "loop", str(path)]))

    def wait(paths: list[Path]) -> None:
        while not all(p.exists() for p in paths):
            if any(p.poll() not in (None, 0) for p in procs):
                raise RuntimeError("an A3 process failed (its output is in the phase's log)")
            time.sleep(0.02)

    try:
        wait([folder / f"ready-{i}" for i in range(most)])
        for count in spec["processes"]:
            (folder / f"go-{count}").touch()
            outs = [folder / f"out-{count}-{i}.json" for i in range(count)]
            wait(outs)
            done = [json.loads(p.read_text()) for p in outs]
            out[str(count)] = {
                "steps_per_s": sum(d["steps"] / d["seconds"] for d in done),
                "steps": [d["steps"] for d in done],
                "threads": threads,
            }
            save(out)
    except BaseException:
        for p in procs:
            p.kill()
        raise
    for p in procs:
        p.wait()
    return out


def main(argv: list[str]) -> int:
    what, path = argv
    spec = json.loads(Path(path).read_text())

    def save(result: dict) -> None:  # what a phase cut by the budget has measured stays
        Path(spec["out"]).write_text(json.dumps(result, indent=1))

    phases = {"probe": lambda: save(probe(spec)), "step": lambda: bare_steps(spec, save),
              "concurrent": lambda: concurrent(spec, Path(path).parent, save),
              "loop": lambda: loop(spec)}  # fmt: skip
    if what not in phases:
        raise SystemExit(f"gpu_step.py: unknown {what!r}; known: {', '.join(phases)}")
    if what != "loop":  # each phase says where it ran, so a call of A2 or A3 alone names it
        Path(spec["out"]).with_name("platform.json").write_text(json.dumps(platform()))
    phases[what]()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
