"""Which deepinfer CLI the Python tests run.

DEEPINFER_CLI wins; then the test suite's own build ($BUILD_DIR, default build/, the folder
./build.sh makes and ./test.sh runs); then any other build*/deepinfer, newest first. A plain
sorted glob would pick build-prebuilt/ (or another stale helper build) before build/, since '-'
sorts before '/', and test yesterday's binary.
"""
import glob
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def candidates():
    out = []
    env = os.environ.get("DEEPINFER_CLI")
    if env:
        out.append(env)
    build = Path(os.environ.get("BUILD_DIR", "build"))
    out.append(str((build if build.is_absolute() else ROOT / build) / "deepinfer"))
    others = [c for c in glob.glob(str(ROOT / "build*/deepinfer")) if c not in out]
    out += sorted(others, key=lambda c: os.path.getmtime(c), reverse=True)
    return out


def find_cli(needs=None):
    """The first existing candidate; with `needs` (a subcommand), the first whose `needs --help` works."""
    for c in candidates():
        if not os.path.exists(c):
            continue
        if needs is None or subprocess.run([c, needs, "--help"], capture_output=True).returncode == 0:
            return c
    return None
