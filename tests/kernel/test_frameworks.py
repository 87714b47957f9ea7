"""Training frameworks run unmodified in ranks, for real (issue #17): Lightning, Hugging Face's
``Trainer``, ``accelerate``, torch's FSDP2 and ``torch.distributed.checkpoint``, each in a fresh cell
and on a kept world, on CPU with gloo, tiny models and synthetic data, their progress bars shown.

A rank is a launched worker to them (the torchelastic environment, no ``sys.ps1``), while it still
looks like a notebook to display code.  One kernel for the whole module (imports are the cost).
"""

from __future__ import annotations

import importlib.util
import re
import uuid

import pytest
from kernel_harness import ok, rank_lines
from training_cells import LIGHTNING
from widget_harness import spawn_widget

# found, not imported: this test process forks ranks of its own elsewhere (tests/kernel/test_terminal.py),
# and what it imported (tqdm.auto, resolved once) they would inherit
_MISSING = [m for m in ("lightning", "transformers", "accelerate", "rich") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(
    bool(_MISSING),
    reason=f"not installed: {', '.join(_MISSING)} (the `frameworks` extra: pip install -e '.[test,frameworks]', "
    "or scripts/setup.sh with its default NBSPAWN_EXTRAS)",
)

WIDGET = "application/vnd.nbspawn.widget+json"


FIT = """
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                    enable_checkpointing=False, enable_model_summary=False{bar})
trainer.fit(Tiny(), data)
env = type(trainer.strategy.cluster_environment).__name__
print("fit", trainer.global_rank, trainer.world_size, env, trainer.global_step)
"""

ACCELERATE = """
import torch
from accelerate import Accelerator
accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for x, y in loader:
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    optimizer.step()
    optimizer.zero_grad()
print("accelerate", accelerator.process_index, accelerator.num_processes, accelerator.distributed_type.value, len(loader))
"""

HF_TRAINER = """
import tempfile, torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=16, max_position_embeddings=16)
class Synthetic(torch.utils.data.Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return {"input_ids": torch.randint(0, 50, (8,)), "labels": torch.tensor(i % 2)}
args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, num_train_epochs=2,
                         report_to=[], use_cpu=True, save_strategy="no", logging_steps=1)
hf = Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Synthetic())
result = hf.train()
print("hf", hf.args.process_index, hf.args.world_size, result.global_step)
"""

FSDP = """
import os, torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
mesh = init_device_mesh("cpu", (2,))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""

FSDP_STEP_AND_CHECKPOINT = """
import torch.distributed.checkpoint as dcp
for _ in range(3):
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
weight = model[0].weight
print("fsdp", type(weight).__name__, tuple(weight.to_local().shape), tuple(weight.shape))
before = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
dcp.save({"model": model.state_dict()}, checkpoint_id=CHECKPOINT)
with torch.no_grad():
    for p in model.parameters():
        p.zero_()
state = {"model": model.state_dict()}
dcp.load(state, checkpoint_id=CHECKPOINT)
model.load_state_dict(state["model"])
same = all(torch.equal(before[k], v.full_tensor()) for k, v in model.state_dict().items())
print("dcp", same, sorted(os.listdir(CHECKPOINT)))
"""


@pytest.fixture
def world(kernel):
    name = f"fw{uuid.uuid4().hex[:6]}"
    yield name
    ok(kernel, f"%spawn stop {name}")


def _each_rank(stdout: str, pattern: str) -> list[re.Match[str]]:
    found = []
    for r in range(2):
        match = next((m for line in rank_lines(stdout, r) if (m := re.fullmatch(pattern, line))), None)
        assert match is not None, (r, pattern, stdout[-3000:])
        found.append(match)
    return found


def _live_items(run, rank: int) -> list[dict]:
    return [
        value
        for msg in run.custom
        if msg["type"] == "output"
        for r, stream, value in msg["chunks"]
        if r == rank and stream == "display"
    ]


# -- Lightning -------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["forkserver", "fork"])
def test_lightning_ddp_trains_in_a_fresh_cell_with_its_progress_bar(kernel, method):
    """strategy="ddp" sees launched ranks (TorchElasticEnvironment), not a notebook to fork from.

    Under forkserver nothing of Lightning is in the rank (its server preloads torch, nbspawn and
    IPython's shell, not Lightning);
    for fork the kernel imported Lightning first,
    so the ranks inherit the flag it computed at import (``_IS_INTERACTIVE``), and must not use it.
    """
    if method == "fork":
        ok(kernel, "import lightning")
    result, run = spawn_widget(kernel, LIGHTNING + FIT.format(bar=""), options=f"-n 2 --start-method {method}", timeout=240)
    assert result.status == "ok", result.error_text
    text = "".join(run.live_text().values())
    assert "fit 0 2 TorchElasticEnvironment 8" in text and "fit 1 2 TorchElasticEnvironment 8" in text, text[-3000:]
    assert "interactive" not in text and "ddp_notebook" not in text
    # rank 0's RichProgressBar (the default where rich is installed): in a forked rank rich sees
    # ipykernel's shell and draws through an ipywidgets.Output; a forkserver rank's shell is IPython's
    # own, and rich draws its bar as text, redrawn in place with \r and ANSI
    if method == "fork":
        bars = [i for i in _live_items(run, 0) if str(i.get("id", "")).startswith("nbspawn-output:")]
        assert any("Epoch 1/1" in str(i.get("text", "")) for i in bars), _live_items(run, 0)
    else:
        assert "Epoch 1/1" in run.live_text()[0], run.live_text()[0][-3000:]


def test_lightning_trains_twice_on_a_kept_world(kernel, world):
    ok(kernel, f"%%spawn --world {world} -n 2 --backend gloo\n{LIGHTNING}", timeout=240)
    first = ok(kernel, f"%%spawn --world {world}\n{FIT.format(bar='')}", timeout=240)
    _each_rank(first.stdout, r"fit \d 2 TorchElasticEnvironment 8")
    # a second Trainer in the same processes, with tqdm's bar this time (a notebook bar in a rank)
    code = "from lightning.pytorch.callbacks import TQDMProgressBar\n" + FIT.format(bar=", callbacks=[TQDMProgressBar()]")
    second = ok(kernel, f"%%spawn --world {world}\n{code}", timeout=240)
    _each_rank(second.stdout, r"fit \d 2 TorchElasticEnvironment 8")
    assert re.search(r"Epoch 1: 100%\|█+\| 4/4", "\n".join(rank_lines(second.stdout, 0))), second.stdout[-3000:]


# -- accelerate and Hugging Face's Trainer ---------------------------------------------------------


def test_accelerate_and_the_hf_trainer_train_in_a_fresh_cell_with_its_progress(kernel):
    result, run = spawn_widget(kernel, ACCELERATE + HF_TRAINER, options="-n 2", timeout=240)
    assert result.status == "ok", result.error_text
    text = "".join(run.live_text().values())
    for r in range(2):
        assert f"accelerate {r} 2 MULTI_CPU 4" in text and f"hf {r} 2 4" in text, text[-3000:]
    # the Trainer's notebook progress (an HTML table with a <progress>, updated in place) in rank 0's pane
    progress = [i for i in _live_items(run, 0) if i.get("mime") == "text/html" and "<progress" in str(i.get("value"))]
    assert progress and any(i["kind"] == "update" for i in progress), _live_items(run, 0)
    assert "4/4" in progress[-1]["value"], progress[-1]["value"]


def test_accelerate_then_the_hf_trainer_on_a_kept_world(kernel, world):
    first = ok(kernel, f"%%spawn --world {world} -n 2 --backend gloo\n{ACCELERATE}", timeout=240)
    _each_rank(first.stdout, r"accelerate \d 2 MULTI_CPU 4")
    second = ok(kernel, f"%%spawn --world {world}\n{HF_TRAINER}", timeout=240)
    _each_rank(second.stdout, r"hf \d 2 4")


# -- FSDP2 and torch.distributed.checkpoint --------------------------------------------------------


def test_fsdp2_trains_and_checkpoints_in_a_fresh_cell(kernel, tmp_path):
    code = f"CHECKPOINT = {str(tmp_path / 'ckpt')!r}\n" + FSDP + FSDP_STEP_AND_CHECKPOINT
    result = ok(kernel, f"%%spawn -n 2 --backend gloo\n{code}", timeout=240)
    _each_rank(result.stdout, r"fsdp DTensor \(8, 8\) \(16, 8\)")
    _each_rank(result.stdout, r"dcp True \['\.metadata', '__0_0\.distcp', '__1_0\.distcp'\]")


def test_fsdp2_shards_in_one_world_cell_and_checkpoints_in_the_next(kernel, world, tmp_path):
    ok(kernel, f"%%spawn --world {world} -n 2 --backend gloo\n{FSDP}", timeout=240)
    code = f"CHECKPOINT = {str(tmp_path / 'ckpt')!r}\n" + FSDP_STEP_AND_CHECKPOINT
    result = ok(kernel, f"%%spawn --world {world}\n{code}", timeout=240)
    _each_rank(result.stdout, r"fsdp DTensor \(8, 8\) \(16, 8\)")
    _each_rank(result.stdout, r"dcp True \['\.metadata', '__0_0\.distcp', '__1_0\.distcp'\]")
