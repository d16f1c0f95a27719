"""The museum is slow (an environment per release, a process per entry): the default suite
leaves it out; `DA_MUSEUM=1 python -m pytest tests/museum` (or .ci/museum) runs it."""

import os

collect_ignore_glob = [] if os.environ.get("DA_MUSEUM") == "1" else ["test_*.py"]
