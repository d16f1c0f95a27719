"""The command-line tests' shared fixtures (defined in tests/cli_support.py)."""

from cli_support import converted, foreign, hf_folder, interrupted_run, run_copy  # noqa: F401
