"""What the commands say, in the command line's terms and true to what ran (issue 35).

- A refusal names flags, not the library's Python: `--vocab-size` where "audit() needs
  vocab_size=V" is meant, `--max-seq-len N` for "cfg.replace(max_seq_len=N)", `--top-k=0` for a
  top_k the user typed; a value the user did not give (the model's own vocab_size) stays as it is,
  and the library's Python-facing message is unchanged.
- `--spec /dev/null` (a character device), a folder, an empty file: said as what they are.
- `verify --shard` of a module that is not a Decoder names its class and verify, not train.
- A value starting with a dash is joined with `=` in the rerun command, which parses back.
- train's initial-loss refusal names the train command that reproduces it (verify passes it).
- A finished run resumed says so with its last step's figures, no NaN or zero speed, and leaves
  its files as they were.
- `verify --hf` of a Llama (its ledger and oracle run on its weights) is not labelled black-box.
- The cost line's T is the longest input the model ran; prepare names a tokenizer file once;
  a skip reason reads as a sentence.

Messages are checked for their facts (the flag, the value, the class, the path), not their
wording."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import stat
from pathlib import Path

import pytest
import torch
from cli_support import NO_LIMIT, TRAIN, error_line, snapshot

import decoder_audit as da
from decoder_audit.cli import build_parser, main
from decoder_audit.errors import ConfigError

# cli_support's running mean (no hard length limit, V = 8), and two more factories.
MODULES = NO_LIMIT + '''

class Confident(Running):
    """Correct, but initialised at PyTorch's N(0, 1) and scaled: its loss starts far above ln V."""

    def forward(self, ids):
        return 4.0 * super().forward(ids)


def confident():
    torch.manual_seed(0)
    return Confident()


class Knows(nn.Module):
    """Causal, and trained already on the counting task (<bos> x next(x) next(next(x)) <eos>):
    its logits at a letter favour the letter after it and <eos>, at <bos> the four first
    letters, so the task's loss starts far below ln V (about 0.9 against ln 8 = 2.08)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.Embedding(8, 8)
        with torch.no_grad():
            self.table.weight.mul_(0.1)  # every token's row its own: each token is read
            for x in range(3, 8):  # A..E: the next letter (E wraps to A) or the end
                self.table.weight[x, 3 + (x - 2) % 5] = 8.0
                self.table.weight[x, 2] = 8.0
            self.table.weight[1, 3:7] = 8.0  # <bos>: any of A..D

    def forward(self, ids):
        if ids.dim() != 2:
            raise ValueError(f"ids must be (B, T), got {tuple(ids.shape)}")
        return self.table(ids)


def knows():
    return Knows()


def sequential():
    return nn.Sequential(nn.Embedding(8, 8), nn.Linear(8, 8))
'''


@pytest.fixture
def modules(tmp_path) -> Path:
    (tmp_path / "modules.py").write_text(MODULES)
    return tmp_path / "modules.py"


# ---- refusals in flags ---------------------------------------------------------------------

def test_a_missing_vocab_size_names_the_flag_and_the_library_keeps_its_words(modules, capsys):
    assert main(["verify", "--model", f"{modules}:sequential", "--no-progress"]) == 2
    line = error_line(capsys, "verify")
    assert "--vocab-size" in line and "--max-seq-len" in line and "Sequential" in line, line
    assert "audit()" not in line and "vocab_size=V" not in line, line
    model = torch.nn.Sequential(torch.nn.Embedding(8, 8), torch.nn.Linear(8, 8))
    with pytest.raises(ConfigError, match=re.escape("audit() needs vocab_size=V")):
        da.audit(model)  # the Python caller still reads the Python argument


def test_account_past_the_context_names_max_seq_len_as_a_flag(capsys):
    assert main(["account", "--seq", "2048", "--no-measure"]) == 2
    line = error_line(capsys, "account")
    assert "--max-seq-len 2048" in line and "cfg.replace" not in line, line


def test_a_value_the_user_typed_is_their_flag_and_the_models_own_stays(capsys):
    assert main(["verify", "--vocab-size", "9", "--no-progress"]) == 2  # tiny-368: V = 8
    line = error_line(capsys, "verify")
    assert "--vocab-size=9" in line and "vocab_size=8" in line, line
    assert "--vocab-size=8" not in line


def test_sample_names_the_flags_of_its_sampling_arguments(tmp_path, capsys):
    assert main(["train", "--steps", "1", "--out", str(tmp_path / "run"), *TRAIN]) == 0
    capsys.readouterr()
    base = ["sample", "--checkpoint", str(tmp_path / "run"), "--prompt", "<bos> A"]
    for extra, flag in ((["--top-k", "0", "--temperature", "1"], "--top-k"),
                        (["--max-new-tokens", "0"], "--max-new-tokens")):
        with pytest.raises(SystemExit) as refused:  # out of the option's range (cli/values.py)
            main([*base, *extra])
        assert refused.value.code == 2
        line = error_line(capsys, "sample")
        python_name = flag.removeprefix("--").replace("-", "_")  # top_k: the library's word
        assert f"{flag}: 0 " in line and not re.search(rf"(?<![\w-]){python_name}", line), line
        assert "None" not in line, line


# ---- what a path is ------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--spec", "--config"])
def test_a_spec_or_config_that_is_no_json_file_is_said_as_what_it_is(modules, tmp_path, capsys,
                                                                     flag):
    (tmp_path / "empty.json").write_text("")
    os.mkfifo(tmp_path / "pipe")
    model = ["--model", f"{modules}:build", "--vocab-size", "8"] if flag == "--spec" else []
    for path, kind in (("/dev/null", "character device"), (str(tmp_path), "folder"),
                       (str(tmp_path / "empty.json"), "empty"),
                       (str(tmp_path / "pipe"), "pipe")):
        assert main(["verify", *model, flag, path, "--no-progress"]) == 2
        line = error_line(capsys, "verify")
        assert flag in line and repr(path) in line and kind in line, line
        assert "does not exist" not in line, line
    assert stat.S_ISFIFO(os.stat(tmp_path / "pipe").st_mode)  # never opened (it would block)


def test_verify_shard_of_a_module_that_is_no_decoder_names_its_class(modules, capsys):
    assert main(["verify", "--shard", "--model", f"{modules}:sequential", "--vocab-size", "8",
                 "--max-seq-len", "4", "--no-progress"]) == 2
    line = error_line(capsys, "verify")
    assert "torch.nn.modules.container.Sequential" in line and "Decoder" in line, line
    assert "verify" in line.split("error:", 1)[1] and "train" not in line, line


# ---- the rerun command ---------------------------------------------------------------------

def test_a_value_with_a_leading_dash_reruns_as_it_was_given(tmp_path, monkeypatch, capsys):
    example = Path(__file__).resolve().parents[2] / "examples" / "learner"
    monkeypatch.chdir(tmp_path)
    Path("-map.py").write_text(
        "from decoder_audit.references.layouts import detect\n"
        "import decoder_audit as da\n"
        f"SPEC = da.DecoderConfig.load({str(example / 'spec.json')!r})\n"
        "def good(state):\n"
        "    return detect(state, SPEC).canonical(state)\n")
    assert main(["verify", "--model", f"{example / 'model.py'}:build", "--spec",
                 str(example / "spec.json"), "--weights-map=-map.py:good", "--json"]) == 0
    words = shlex.split(json.loads(capsys.readouterr().out)["command"])
    args = build_parser().parse_args(words[1:])  # exits (status 2) on a broken command
    assert args.weights_map == "-map.py:good" and args.spec == str(example / "spec.json")


# ---- train's own check, and a finished run -------------------------------------------------

def test_the_initial_loss_refusal_names_the_train_command_that_reproduces_it(modules, tmp_path,
                                                                             monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--model", f"{modules}:knows", "--vocab-size", "8",
            "--intervention-len", "4", "--seed", "3", "--out", "run", *TRAIN]
    assert main(argv) == 1
    said = capsys.readouterr().out.replace("\n", " ")
    assert "initial loss" in said and "below ln V" in said
    commands = [c for c in re.findall(r"`(decoder-audit [^`]+)`", said) if " train " in c]
    assert len(commands) == 1, said
    words = shlex.split(commands[0])
    assert words[1] == "train" and f"{modules}:knows" in words and "3" in words, words
    assert main(["verify", "--model", f"{modules}:knows", "--vocab-size", "8",
                 "--intervention-len", "4", "--no-progress"]) == 0  # verify passes it
    capsys.readouterr()
    assert main([*words[1:], "--no-progress"]) == 1  # the command named reproduces it
    assert "initial loss" in capsys.readouterr().out
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_a_correct_model_initialised_at_a_large_scale_with_no_length_limit_trains(
        modules, tmp_path, capsys):
    """The running mean at PyTorch's N(0, 1), scaled: correct (verify passes it), no hard length
    limit, and a loss that starts far above ln V (2.70 against ln 8 = 2.08) because of its
    initialisation's scale, which its logits' spread accounts for. It was refused at the
    initial-loss check; it trains, and the scale is said."""
    argv = ["train", "--model", f"{modules}:confident", "--vocab-size", "8",
            "--intervention-len", "4", "--seed", "3", "--out", str(tmp_path / "run"), *TRAIN]
    assert main(argv) == 0
    said = capsys.readouterr().out.replace("\n", " ")
    loss = float(re.search(r"initial loss ([0-9.]+) vs ln V", said)[1])
    assert loss > 1.1 * math.log(8)  # outside the 10% band, so judged: and not refused
    assert "standard deviation" in said and "training refused" not in said
    assert (tmp_path / "run" / "checkpoint").is_dir()


def test_a_finished_run_resumed_says_so_with_its_last_figures(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--steps", "2", "--out", str(out), *TRAIN]) == 0
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    before = snapshot(out)
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0
    said = capsys.readouterr().out.replace("\n", " ")
    assert "nan" not in said.lower() and "MFU" not in said and " 0 tokens/s" not in said, said
    assert "step 2" in said and f"{last['loss']:.4f}" in said, said
    assert f"{last['tokens_per_s']:,.0f} tokens/s" in said, said
    assert snapshot(out) == before  # nothing trained, nothing rewritten


# ---- what the report says ran --------------------------------------------------------------

def test_a_hugging_face_llama_is_not_labelled_black_box(tmp_path, capsys):
    tf = pytest.importorskip("transformers")
    tf.logging.set_verbosity_error()
    config = tf.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24,
                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                            max_position_embeddings=16, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    tf.LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    capsys.readouterr()
    assert main(["verify", "--hf", str(tmp_path / "llama"), "--intervention-len", "8",
                 "--report", str(tmp_path / "report"), "--no-progress"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    ran = {c["name"] for c in report["checks"] if not c["skipped"]}
    assert {"params", "oracle"} <= ran  # the ledger and the oracle ran on its weights
    assert "LlamaForCausalLM" in header and "black-box" not in header, header
    assert "black-box" not in (tmp_path / "report" / "report.md").read_text().splitlines()[2]


@pytest.mark.parametrize("length", [8, None])  # None: the default intervention length
def test_the_cost_line_counts_at_the_longest_input_the_model_ran(modules, capsys, length):
    given = [] if length is None else ["--intervention-len", str(length)]
    assert main(["verify", "--model", f"{modules}:build", "--vocab-size", "8", *given,
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    causal = next(c for c in report["checks"] if c["name"] == "causal")
    probed = report["facts"]["intervention_len"]  # no hard limit: every check within it
    assert probed == (length or 64) and causal["evidence"]["seq_len"] == probed
    cost = report["cost"]
    assert cost["longest_input"] == probed
    assert cost["forward_equivalents"] == round(cost["tokens"] / probed, 2)
    assert main(["verify", "--model", f"{modules}:build", "--vocab-size", "8", *given,
                 "--no-progress"]) == 0
    cost_line = next(line for line in capsys.readouterr().out.splitlines()
                     if line.startswith("cost:"))
    assert f"T={probed}" in cost_line, cost_line


def test_a_skip_reason_reads_as_a_sentence(modules, capsys):
    assert main(["verify", "--model", f"{modules}:build", "--vocab-size", "8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["checks"]
    attention = next(c for c in rows if c["name"] == "attention_rows")
    assert attention["skipped"] and "its the" not in attention["detail"], attention["detail"]


def test_prepare_names_a_tokenizer_file_once(tmp_path, capsys, monkeypatch):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"w{i}": i for i in range(20)} | {"</s>": 20}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="</s>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    (tmp_path / "words").mkdir()
    backend.save(str(tmp_path / "words" / "tokenizer.json"))
    (tmp_path / "text.txt").write_text(" ".join(f"w{i % 20}" for i in range(200)))
    # a short relative path: the console is 100 columns wide whatever the terminal, and a long
    # temporary folder's path (pytest-xdist's workers nest one level deeper) would wrap the line
    monkeypatch.chdir(tmp_path)
    given = "words/tokenizer.json"
    assert main(["prepare", "--text", "text.txt", "--tokenizer", given, "--out", "data"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines()
                if line.startswith("tokenizer "))
    assert line.count("tokenizer.json") == 1 and given in line, line
