"""Gated training: audit first, refuse on any failure, then train what passed.

    train(model)                      one process
    torchrun --nproc_per_node N ...   the same code under DistributedDataParallel
    train(model, shard=True)          FSDP2: each process holds 1/N of the training state

    loop.py         train(): prepare -> gate -> evidence -> loop -> finish, each a short phase
    run.py          what the phases hand each other (Setting, Prepared, Training, Evidence),
                    the run options, the shared evaluation, a checkpoint, the metrics row
    prepare.py      the model, the task, the memory and thread checks (phase 1)
    start.py        the gate, optimizer, resumed state, DDP (phase 2) and the evidence (phase 3)
    step.py         one optimizer step on one global batch (micro-batches, bf16 autocast,
                    torch.compile)
    throughput.py   tokens/s and MFU (accounting's FLOPs x 3 over a given or measured peak)
    finish.py       the final evaluation and checkpoint, the loss curve, the summary (phase 5)
    settings.py     TrainConfig (what defines a run's result) and TrainResult
    gatekeeper.py   the gate before training (GateRefusal) and the
                    evidence before step 1 (loss alignment, initial loss near ln V)
    optim.py        AdamW over the unique Parameters, warmup + cosine, gradient clipping
    distributed.py  the process group, each rank's device, DDP, FSDP2 sharding
    state.py        the run folder and the resumable training state (bitwise resume; a
                    sharded run's gathered to rank 0, so either kind resumes the other's)
    lock.py         one run per run folder (run.lock, the owner's pid, stale locks taken over)
"""

from .gatekeeper import GateRefusal
from .loop import train
from .settings import TrainConfig, TrainResult

__all__ = ["GateRefusal", "TrainConfig", "TrainResult", "train"]
