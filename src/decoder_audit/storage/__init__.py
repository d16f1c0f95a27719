"""What is written to disk and read back: checkpoints and output folders.

    checkpoint.py  the checkpoint folder (safetensors + config.json): its format, digests and
                   refusals, saving and loading a Decoder or any module's weights
    folder.py      writing any output folder atomically, and what a crash leaves behind
"""
