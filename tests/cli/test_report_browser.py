"""The HTML report in a real browser: headless Chromium from the system's package manager (.ci/run
installs it: `apt-get install -y chromium` on Debian). The page is drawn to a screenshot whose size
and content are checked, its DOM is dumped and read for the input's figures, and it is printed to
PDF. Outside CI a missing browser skips with the reason; in CI (CI=true) it fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

DATA = Path(__file__).resolve().parents[1] / "data"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WIDTH, HEIGHT = 1280, 2400


def browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    why = f"no headless Chromium on PATH (tried {', '.join(BROWSERS)}; .ci/run installs it: apt-get install -y chromium)"
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={tmp_path / 'profile'}", "--disable-extensions", "--mute-audio", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    inputs = [str(p) for p in sorted(DATA.glob("*.json"))]
    r = subprocess.run([sys.executable, "-m", "gpubench", "report", *inputs, "-o", str(out), "--baseline",
                        str(DATA / "copy-all-h200.json")], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def test_the_report_renders_to_a_screenshot_of_the_window_size_with_content(report, tmp_path):
    from PIL import Image

    shot = tmp_path / "shot.png"
    r = chromium(tmp_path, f"--screenshot={shot}", f"--window-size={WIDTH},{HEIGHT}", report.as_uri())
    assert shot.exists(), r.stderr[-2000:]
    with Image.open(shot) as im:
        assert im.size == (WIDTH, HEIGHT)
        rgb = im.convert("RGB")
        small = rgb.resize((WIDTH // 4, HEIGHT // 4))
        raw = small.tobytes()
    pixels = [tuple(raw[i:i + 3]) for i in range(0, len(raw), 3)]
    non_white = sum(1 for p in pixels if sum(p) < 720) / len(pixels)
    colours = len(set(pixels))
    # text, tables, the highlighted flag rows and the inline plots: far from a blank page
    assert non_white > 0.05, non_white
    assert colours > 200, colours
    # the flag colour (a pale red row or list item) is drawn: the stylesheet applied
    assert any(abs(p[0] - 0xfd) < 6 and abs(p[1] - 0xe0) < 8 and abs(p[2] - 0xdc) < 8 for p in pixels)


def test_the_dom_holds_the_figures_of_the_input(report, tmp_path):
    from gpubench.core.result import load

    r = chromium(tmp_path, "--dump-dom", report.as_uri())
    dom = r.stdout
    assert "gpubench report" in dom and "Verdicts and flags" in dom, r.stderr[-2000:]
    nccl = load(DATA / "nccl-h200x2.json")
    rec = next(x for x in nccl.records if x.params["nbytes"] == 2**30 and x.params["placement"] == "in-place")
    assert f">{rec.rate_summary().median / 1e9:.1f}<" in dom
    net = load(DATA / "net-local.json")
    total = next(x for x in net.records if x.params["stream"] == "total")
    assert f">{total.rate_summary().median / 1e9:.2f}<" in dom
    assert dom.count("<img") == len(list(DATA.glob("*.json"))) + 1  # + the overlay of the copy comparison
    assert "<script" not in dom


def test_the_report_prints_to_pdf(report, tmp_path):
    pdf = tmp_path / "report.pdf"
    r = chromium(tmp_path, f"--print-to-pdf={pdf}", "--no-pdf-header-footer", report.as_uri())
    assert pdf.exists(), r.stderr[-2000:]
    data = pdf.read_bytes()
    assert data[:5] == b"%PDF-"
    pages = data.count(b"/Type /Page") - data.count(b"/Type /Pages")
    assert 3 <= pages <= 60, pages
