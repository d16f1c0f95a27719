"""Independent references and weight transfer.

`torch_modules`: the torch.nn twin (stock modules only) and transfer to and from `Decoder`.
`hf`: Hugging Face GPT-2 and Llama, both ways, in memory and as `save_pretrained` folders;
`try_from_hf(model)` asks the converter whether it can read a module (the gate's question).
`transformers` is imported only when an `hf` function runs (it is the optional extra `hf`).
"""

from .hf import from_hf, load_hf_folder, save_hf_folder, to_hf, try_from_hf
from .torch_modules import (
    TorchTwin,
    decoder_from_twin,
    decoder_to_twin_tensors,
    twin_from_decoder,
    twin_to_decoder_tensors,
    twin_unsupported,
)

__all__ = [
    "TorchTwin", "decoder_from_twin", "decoder_to_twin_tensors", "from_hf", "load_hf_folder",
    "save_hf_folder", "to_hf", "try_from_hf", "twin_from_decoder", "twin_to_decoder_tensors",
    "twin_unsupported",
]
