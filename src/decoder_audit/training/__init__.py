"""Gated training: audit first, refuse on any failure, then train what passed.

    train(model)                      one process
    torchrun --nproc_per_node N ...   the same code under DistributedDataParallel
    train(model, shard=True)          FSDP2: each process holds 1/N of the training state

    loop.py         train(): prepare -> gate -> evidence -> loop -> finish, each a short phase
    run.py          the Run the phases share, its Options, the shared evaluation and metrics row
    prepare.py      the model, the task, the memory and thread checks (phase 1)
    start.py        the gate, optimizer, resumed state, DDP (phase 2) and the evidence (phase 3)
    step.py         one optimizer step on one global batch (micro-batches, bf16 autocast,
                    torch.compile)
    throughput.py   tokens/s and MFU (accounting's FLOPs x 3 over a given or measured peak)
    finish.py       the final evaluation and checkpoint, the loss curve, the summary (phase 5)
    settings.py     TrainConfig (what defines a run's result) and TrainResult
    gatekeeper.py   the gate before training (GateRefusal, the facts it establishes) and the
                    evidence before step 1 (loss alignment, initial loss near ln V)
    optim.py        AdamW over the unique Parameters, warmup + cosine, gradient clipping
    distributed.py  the process group, each rank's device, DDP, FSDP2 sharding
    state.py        the run folder and the resumable training state (bitwise resume; a
                    sharded run's gathered to rank 0, so either kind resumes the other's)
    lock.py         one run per run folder (run.lock, the owner's pid, stale locks taken over)
"""

from ..checkpoint import CHECKPOINT_DIR, checkpoint_folder
from ..objective import next_token_loss
from .distributed import RankInfo, init_distributed, resolve_device
from .gatekeeper import (INITIAL_LOSS_TOLERANCE, GateRefusal, ModelFacts, check_initial_loss,
                         check_tied, run_gate)
from .loop import SMALL_MODEL_PARAMETERS, train
from .optim import clip_gradients, lr_lambda, make_optimizer, param_groups
from .settings import DEFAULT_LR, TrainConfig, TrainResult
from .state import (METRICS_FILE, PLOT_FILE, STATE_FILE, TRAINER_FILE, RunFolder, plot_losses,
                    read_trainer_state, save_training_checkpoint, truncate_metrics)

__all__ = [
    "CHECKPOINT_DIR", "DEFAULT_LR", "GateRefusal", "INITIAL_LOSS_TOLERANCE", "METRICS_FILE",
    "ModelFacts", "PLOT_FILE", "RankInfo", "RunFolder", "SMALL_MODEL_PARAMETERS", "STATE_FILE",
    "TRAINER_FILE", "TrainConfig", "TrainResult", "check_initial_loss", "check_tied",
    "checkpoint_folder", "clip_gradients", "init_distributed", "lr_lambda", "make_optimizer",
    "next_token_loss", "param_groups", "plot_losses", "read_trainer_state", "resolve_device",
    "run_gate", "save_training_checkpoint", "train", "truncate_metrics",
]
