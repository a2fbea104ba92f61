"""Reports: Markdown/JSON tables, and the HTML page rendered by headless Chromium."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re
import shutil
import subprocess

import pytest

from t10c import __version__
from t10c.cli import main

SECTIONS = ("summary", "latency", "per-op", "predicted", "pareto", "sram", "timeline")
CHROMIUM = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--hide-scrollbars", "--window-size=1400,1000", "--virtual-time-budget=10000")


def test_markdown_and_json(capsys) -> None:
    assert main(["compare", "mlp", "--chip", "test16", "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert out.count("| mlp | test16 |") == 3
    assert main(["compare", "mlp", "--chip", "test16", "--format", "json",
                 "--strategies", "t10,vgm"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["strategy"] for r in rows] == ["t10", "vgm"]
    assert all(r["matches_onnxruntime"] for r in rows)
    assert rows[0]["speedup_over_vgm"] > 0
    assert 0 < rows[0]["roofline_fraction"] <= rows[0]["ideal_fraction"] <= 1


@pytest.fixture(scope="module")
def html_report(tmp_path_factory):
    pytest.importorskip("matplotlib")
    path = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["compare", "bert-tiny", "--chip", "test16", "--seq-len", "16",
                 "--strategies", "t10,no-rotation,vgm", "-o", str(path)]) == 0
    return path


def _summary(text: str) -> tuple[list[str], list[dict[str, str]]]:
    """The summary table's headers and its rows as {data-key: cell text}."""
    summary = text.split("id='summary'", 1)[1].split("</section>", 1)[0]
    head = re.findall(r"<th>(.*?)</th>", summary)
    rows = [dict(re.findall(r"<td data-key='([^']+)'[^>]*>(.*?)</td>", tr))
            for tr in summary.split("<tr>")[2:]]
    return head, rows


def test_html_is_self_contained_and_explains(html_report) -> None:
    text = html_report.read_text()
    for section in SECTIONS:
        assert f"id='{section}'" in text
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", text)  # nothing from a network
    title = re.search(r"<h1>(.*?)</h1>", text).group(1)  # type: ignore[union-attr]
    assert "bert-tiny" in title and "test16" in title and __version__ in title
    assert "sequence length 16" in text and "dtype fp16" in text
    assert "(limit 30, seed 0)" in text  # no search after the solve off meshes by default
    head, rows = _summary(text)
    assert "Latency (µs)" in head and "Of ideal" in head and "Predicted cycles" in head
    assert not [h for h in head if "_" in h], head  # people read it: no JSON keys
    # every strategy has one summary row: its latency, or (a baseline that does not fit) why
    assert [r["strategy"] for r in rows] == ["t10", "no-rotation", "vgm"]
    for r in rows:
        ran = "latency_us" in r
        assert ran != ("error" in r), r  # one or the other
        if ran:
            assert float(r["latency_us"]) > 0 and r["matches_onnxruntime"] == "yes", r
            assert 0 < float(r["roofline_fraction"].rstrip("%")) <= \
                float(r["ideal_fraction"].rstrip("%")) <= 100, r
        else:
            assert "cannot run within" in r["error"] or "does not fit" in r["error"], r
    assert "latency_us" in rows[0], "t10 must compile"
    # all-to-all: peak SRAM per core is sorted, not drawn on an invented grid
    assert "peak SRAM per core, sorted" in text and "chip's grid" not in text
    # the fronts are of distinct ops (bert repeats each layer's ops)
    fronts = re.findall(r"alt='front ([^']+)'", text)
    assert len(fronts) == 3 and len(set(f.split("/", 1)[-1] for f in fronts)) == 3, fronts


def test_sram_on_a_mesh_is_drawn_on_its_grid() -> None:
    pytest.importorskip("matplotlib")
    from test_mesh import MESH

    from t10c import report
    from t10c.chips import PRESETS
    from t10c.compare import run_entry
    from t10c.driver import CompileOptions

    entry = run_entry("mlp", MESH, "t10", CompileOptions())
    drawn = report._sram_cores_chart([entry])
    assert drawn is not None and drawn[0] == "peak SRAM on the chip's grid"
    # the options line says the routed search after the solve ran (a mesh's default)
    assert "(limit 30, seed 0, then up to 3 exact pricings)" in report._title([entry])[1]
    beside = dataclasses.replace(entry, chip=PRESETS["ipu-mk2"])  # a page of two chips
    assert "then up to 3 exact pricings where the chip is a mesh)" in \
        report._title([beside, entry])[1]


def _chart_drew(uri: str) -> bool:
    """A chart's PNG decodes and is not one flat colour."""
    from PIL import Image

    image = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("L")
    lo, hi = image.getextrema()
    return image.width > 100 and hi - lo > 100


CHECKS = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const out = document.createElement('pre');
  out.id = 'checks';
  out.textContent = JSON.stringify({
    scrollWidth: document.documentElement.scrollWidth,
    images: imgs.length,
    drawn: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
    widest: Math.max(...imgs.map(i => i.getBoundingClientRect().right)),
  });
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Chromium is not installed (Debian's chromium package; .ci/run "
                           "installs it where apt-get can)")
def test_html_renders_in_chromium(html_report, tmp_path) -> None:
    from PIL import Image

    text = html_report.read_text()
    uris = re.findall(r"src='(data:image/png;base64,[^']+)'", text)
    assert len(uris) >= 8 and all(_chart_drew(u) for u in uris)
    probe = tmp_path / "probe.html"  # the page with a script that measures it once loaded
    probe.write_text(text.replace("</body>", CHECKS + "</body>"))
    flags = [*CHROMIUM, f"--user-data-dir={tmp_path / 'profile'}"]
    run = subprocess.run(["chromium", *flags, "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=180)
    found = re.search(r'<pre id="checks">(.*?)</pre>', run.stdout)
    assert found, run.stderr[-2000:]
    checks = json.loads(found.group(1))
    assert checks["images"] == len(uris) and checks["drawn"] == len(uris), checks
    assert checks["scrollWidth"] <= 1400 and checks["widest"] <= 1400, checks  # fits 1400 px
    shot = tmp_path / "shot.png"
    subprocess.run(["chromium", *flags, f"--screenshot={shot}", html_report.as_uri()],
                   capture_output=True, timeout=180)
    image = Image.open(shot).convert("L")
    assert image.width == 1400
    lo, hi = image.getextrema()
    assert hi - lo > 100  # something was drawn, not a blank page
