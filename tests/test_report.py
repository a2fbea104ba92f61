"""Reports: Markdown/JSON tables, and the HTML page rendered by headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from t10c.cli import main

SECTIONS = ("summary", "per-op", "pareto", "sram", "timeline")


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


@pytest.fixture(scope="module")
def html_report(tmp_path_factory):
    pytest.importorskip("matplotlib")
    path = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["compare", "bert-tiny", "--chip", "test16", "--seq-len", "16",
                 "--strategies", "t10,no-rotation,vgm", "-o", str(path)]) == 0
    return path


def test_html_is_self_contained(html_report) -> None:
    text = html_report.read_text()
    for section in SECTIONS:
        assert f"id='{section}'" in text
    assert text.count("data:image/png;base64,") >= 6
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", text)  # nothing from a network
    # every strategy has one summary row: its latency, or (a baseline that does not fit) why
    summary = text.split("id='summary'", 1)[1].split("</section>", 1)[0]
    head = re.findall(r"<th>(.*?)</th>", summary)
    rows = [dict(zip(head, re.findall(r"<td>(.*?)</td>", tr))) for tr in
            summary.split("<tr>")[2:]]
    assert [r["strategy"] for r in rows] == ["t10", "no-rotation", "vgm"]
    for r in rows:
        ran = r.get("latency_us", "") != ""
        assert ran != (r.get("error", "") != ""), r  # one or the other
        assert ran == (f"alt='timeline {r['strategy']}'" in text), r
        if ran:
            assert float(r["latency_us"]) > 0 and r["matches_onnxruntime"] == "True", r
        else:
            assert "cannot run within" in r["error"] or "does not fit" in r["error"], r
    assert rows[0]["latency_us"], "t10 must compile"


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Chromium is not installed")
def test_html_renders_in_chromium(html_report, tmp_path) -> None:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]
    run = subprocess.run(["chromium", *flags, "--dump-dom", html_report.as_uri()],
                         capture_output=True, text=True, timeout=120)
    dom = run.stdout
    for section in SECTIONS:
        assert f'id="{section}"' in dom
    assert dom.count("<img") >= 6
    console_errors = [line for line in run.stderr.splitlines()
                      if "CONSOLE" in line and ("ERROR" in line or "Uncaught" in line)]
    assert not console_errors, console_errors
