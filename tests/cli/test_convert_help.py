"""`convert --help` lists the families the converter reads from the converter's own table
(`references.hf_config.spec_classes`, asked of the real transformers module), so the help
cannot drift from what `--from-hf` accepts."""

from __future__ import annotations

import re

import pytest

from decoder_audit.cli import main

tf = pytest.importorskip("transformers")


def test_convert_help_lists_every_family_of_the_converter_and_no_other(capsys):
    from decoder_audit.references.hf_config import spec_classes

    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the description
    table = {model_type: cls.__name__ for model_type, cls in spec_classes(tf).items()}
    listed = dict(re.findall(r"([\w-]+) \((\w+ForCausalLM|\w+LMHeadModel)\)", text))
    assert listed == table
    assert f"reads {len(table)} families" in text
