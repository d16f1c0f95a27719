"""The CPU benchmark of our `Decoder` against Hugging Face transformers, one module per concern.

`run.py` is the one entry point (`python benchmarks/run.py --help`); it walks a table of result
families (A/B rows, memory, the gate's cost, `account`), each measured by its own module here and
rendered by `report.py`. See benchmarks/README.md for the layout and how to add a family.
"""
