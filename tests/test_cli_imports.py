"""What a short command imports (issue 48): ``import keylane`` loads none of keylane's
modules until a public name is used.

Each check runs a fresh interpreter and looks at ``sys.modules``: a property of the
imports, not a timing, so it holds on a busy machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.stack import REPO


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYLANE_")}
    return {**env, "PYTHONPATH": str(REPO), "COLUMNS": "100", **extra}


PUBLIC = """
import json, sys
import keylane
before = sorted(m for m in sys.modules if m.startswith("keylane."))
from keylane import *
names = {name: getattr(keylane, name) is globals()[name] for name in keylane.__all__}
lazy, api = sorted(keylane._HOME_OF), "keylane.api" in sys.modules
print(json.dumps({"before": before, "names": names, "lazy": lazy, "api": api}))
"""


def test_import_keylane_loads_each_public_name_when_it_is_used() -> None:
    # When user code imports keylane, then takes every public name
    done = subprocess.run(
        [sys.executable, "-c", PUBLIC], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    # Then the import alone loaded none of keylane's modules, and every name resolves
    assert shown["before"] == []
    assert shown["api"] is True
    assert all(shown["names"].values())
    assert shown["lazy"] == sorted(set(shown["names"]) - {"__version__"})
