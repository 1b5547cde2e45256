"""Packaging facts users rely on: the distribution name, the Python range, the extras,
install hints that name this distribution, and a CI matrix that matches the classifiers."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DIST = "gpubench-cuda"


def test_the_distribution_is_not_pypis_other_gpubench_and_the_command_stays():
    assert PROJECT["name"] == DIST
    assert PROJECT["scripts"] == {"gpubench": "gpubench.cli:main"}


def test_python_range_classifiers_and_ci_matrix_agree():
    assert PROJECT["requires-python"] == ">=3.11"
    classified = sorted(c.rsplit(" :: ", 1)[1] for c in PROJECT["classifiers"]
                        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert classified == ["3.11", "3.12", "3.13"]
    ci = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert 'python: ["3.11", "3.12", "3.13"]' in ci
    assert "Environment :: GPU :: NVIDIA CUDA :: 12" in PROJECT["classifiers"]
    assert "Environment :: GPU :: NVIDIA CUDA :: 13" in PROJECT["classifiers"]


def test_extras_refer_to_this_distribution_and_exist():
    extras = PROJECT["optional-dependencies"]
    for name, reqs in extras.items():
        for r in reqs:
            m = re.match(r"gpubench(-cuda)?\[([^\]]+)\]", r)
            if m:
                assert m.group(1) == "-cuda", (name, r)
                assert set(m.group(2).split(",")) <= set(extras), (name, r)
    for cuda, tag in (("cuda13", "13"), ("cuda12", "12")):
        joined = " ".join(extras[cuda])
        assert f"cupy-cuda{tag}x" in joined and "cuda-toolkit[nvrtc,cudart]" in joined
        assert f"nvidia-nccl-cu{tag}>=2.27.7,<3" in joined and "cuda-bindings" in joined


def test_every_lower_bound_is_pinned_in_the_lowest_constraints():
    pins = dict(line.split("==") for line in (ROOT / "ci" / "constraints-lowest.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    wanted = PROJECT["dependencies"] + [r for e in ("plot", "dask", "test") for r in PROJECT["optional-dependencies"][e]
                                        if not r.startswith("gpubench")]
    for req in wanted:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?>=([0-9.]+)", req)
        assert m, req
        name, low = m.group(1), m.group(3)
        assert name in pins or (name == "dask" and "distributed" in pins), req
        # the bound itself, or the first release of that series (nvidia-ml-py>=12.535 -> 12.535.77)
        assert pins[name] == low or pins[name].startswith(low + "."), (req, pins[name])


def test_install_hints_name_this_distribution():
    bare = re.compile(r"(?<![\w-])gpubench\[")  # gpubench[...] without -cuda installs the other project
    offenders = []
    for path in [*ROOT.glob("src/gpubench/**/*.py"), *ROOT.glob("docs/*.md"), ROOT / "README.md", ROOT / "Makefile"]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if bare.search(line) or re.search(r"pip install '?gpubench(?![\w-])", line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []


def test_readme_links_work_on_pypi():
    # PyPI renders README.md without the repository: a relative link there leads nowhere. Every link
    # is absolute, and one into this repository names a file or folder that exists, at the address
    # [project.urls] Source gives.
    source = PROJECT["urls"]["Source"].rstrip("/")
    links = re.findall(r"\]\(([^)\s]+)\)|(?:href|src)=\"([^\"]+)\"|^\[[^\]]+\]:\s*(\S+)",
                       (ROOT / "README.md").read_text(), flags=re.M)
    links = [next(x for x in groups if x) for groups in links]
    assert links, "README.md has no links to check"
    bad = [u for u in links if not u.startswith(("https://", "http://", "#", "mailto:"))]
    assert bad == [], "relative links in README.md"
    for u in links:
        m = re.fullmatch(re.escape(source) + r"/(?:blob|tree)/main/([^#?]+)(?:#.*)?", u)
        if u.startswith(source + "/") and not u.startswith(source + "/issues"):
            assert m and (ROOT / m.group(1)).exists(), u


def test_the_sdist_manifest_ships_the_docs_images():
    # docs/*.md show docs/img/*.png; MANIFEST.in is what puts them in the sdist (make check lists it)
    assert list((ROOT / "docs" / "img").glob("*.png"))
    assert re.search(r"^recursive-include docs [^\n]*\*\.png", (ROOT / "MANIFEST.in").read_text(), flags=re.M)
