"""What is written to disk and read back: checkpoints and output folders.

    checkpoint.py  the checkpoint folder (safetensors + config.json): its format, digests and
                   refusals, saving and loading a Decoder or any module's weights
    folder.py      writing any output folder atomically, and what a crash leaves behind
    sharded.py     sharded checkpoints (torch.distributed.checkpoint): every rank its own rows,
                   resumed on any world size, exported to one safetensors file streamed
    manifest.py    what a sharded checkpoint may hold: its manifest covers every file it reads;
                   DCP's index read without unpickling anything else
"""

from . import sharded  # noqa: F401 - registers its reader: load_checkpoint reads sharded folders
