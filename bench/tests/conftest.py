"""bench/ on sys.path, so that the tests import benchkit as bench/run does."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
