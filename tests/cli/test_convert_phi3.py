"""`convert --from-hf` of a Phi-3 folder with full rotary (issue 35): partial_rotary_factor 1.0,
the Phi3Config default, makes its config one the Llama converter writes, and the folder was read
with Llama's weight names (q_proj, gate_proj) where Phi-3 stores fused qkv_proj and gate_up_proj:
every such folder was refused, while `da.from_hf` of the same model converts. The converted
checkpoint must give Phi3ForCausalLM's own logits."""

from __future__ import annotations

import pytest
import torch
from helpers import randomise

import decoder_audit as da
from decoder_audit.cli import main

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()


@pytest.mark.parametrize("rotary", [None, 0.5])  # None: the config's default factor, 1.0
def test_convert_from_hf_reads_a_phi3_folder_with_its_own_names(tmp_path, capsys, rotary):
    extra = {} if rotary is None else {"partial_rotary_factor": rotary}
    config = tf.Phi3Config(vocab_size=29, hidden_size=32, intermediate_size=37,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=16, pad_token_id=0, bos_token_id=None,
                           eos_token_id=None, attn_implementation="eager", **extra)
    torch.manual_seed(0)
    hf_model = randomise(tf.Phi3ForCausalLM(config), std=0.3).eval()
    hf_model.save_pretrained(tmp_path / "phi3")
    names = set(hf_model.state_dict())
    assert "model.layers.0.self_attn.qkv_proj.weight" in names  # the fused names it stores

    capsys.readouterr()
    assert main(["convert", "--from-hf", str(tmp_path / "phi3"), "--out",
                 str(tmp_path / "ckpt")]) == 0, capsys.readouterr().err
    ours = da.load_checkpoint(tmp_path / "ckpt")
    ids = torch.randint(0, 29, (2, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf_model(ids).logits, rtol=0, atol=1e-5)
