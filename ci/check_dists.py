"""What the built distributions hold (make check, after python -m build): the sdist what a checkout
needs to build, test and read gpubench (the tests and their data, the docs with their images, the
examples, the Makefile, the CI scripts), the wheel the result schema.

    python ci/check_dists.py dist/
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SDIST_HOLDS = ["Makefile", "LICENSE", "CHANGELOG.md", "README.md", "MANIFEST.in", "tests/conftest.py",
               "docs/results.md", "src/gpubench/profiles/h200x2.toml", "ci/constraints-lowest.txt",
               "ci/base_install_check.sh", "src/gpubench/schemas/result-v1.schema.json",
               *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "img").glob("*.png"))]
WHEEL_HOLDS = ["gpubench/schemas/result-v1.schema.json", "gpubench/cli/__init__.py", "gpubench/profiles/h200x2.toml",
               "gpubench/profiles/gcp-a3-high.toml"]


def main(dist: Path) -> int:
    sdists, wheels = sorted(dist.glob("*.tar.gz")), sorted(dist.glob("*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        print(f"{dist}: expected one sdist and one wheel, found {[p.name for p in sdists + wheels]}")
        return 1
    with tarfile.open(sdists[0]) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    with zipfile.ZipFile(wheels[0]) as z:
        in_wheel = set(z.namelist())
    missing = [f"{sdists[0].name}: {n}" for n in SDIST_HOLDS if n not in names]
    missing += [f"{wheels[0].name}: {n}" for n in WHEEL_HOLDS if n not in in_wheel]
    for m in missing:
        print(f"missing from {m}")
    if not missing:
        print(f"ok    {sdists[0].name} ({len(names)} files, {len(SDIST_HOLDS)} checked), "
              f"{wheels[0].name} ({len(in_wheel)} files)")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "dist")))
