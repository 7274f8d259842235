"""Regenerate the docs' and the README's pictures of a real report: ``python docs/make_images.py``.

It runs a real search (``nas search --space prism --preset tiny --trials 40``: real training, about a
minute on 2 cores) into a temporary SQLite file, or reads ``--storage`` / ``--study-name`` (the default
200-trial search's ``nas.db``, say), writes its ``nas report``, opens it in headless Chromium (the
browser the tests drive, through playwright; nothing is downloaded) and saves screenshots into
``docs/images``: the top of the page (summary and leaderboard), and each figure section. It also draws the
recorded benchmark figures 10, 11(c) and 12 (``benchmarks/plots.py``, from ``benchmarks/data``) the same way;
``--figures-only`` draws just those.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

IMAGES = Path(__file__).parent / "images"
SECTIONS = ("staircases", "dynamics", "training", "attention")
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def nas(*args: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "nas.cli", *args], cwd=cwd, check=True, capture_output=True, text=True)


def benchmark_figures(work: Path, out: Path, chromium: str) -> None:
    """Figures 10, 11(c), 12 and 13 as PNG files (``figure-10.png`` ...), drawn by plotly in Chromium."""
    from playwright.sync_api import sync_playwright

    from benchmarks.plots import figure_10, figure_11, figure_12, figure_13

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        for name, fig in (("figure-10", figure_10()), ("figure-11", figure_11()), ("figure-12", figure_12()),
                          ("figure-13", figure_13())):
            page_file = work / f"{name}.html"
            fig.write_html(str(page_file), include_plotlyjs=True, full_html=True)
            page = browser.new_page(viewport={"width": int(fig.layout.width) + 20,
                                              "height": int(fig.layout.height) + 20}, device_scale_factor=1)
            page.goto(page_file.as_uri())
            page.wait_for_selector(".main-svg")
            page.query_selector(".plotly-graph-div").screenshot(path=str(out / f"{name}.png"))
            page.close()
        browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--storage", help="read this study instead of running a tiny search")
    parser.add_argument("--study-name")
    parser.add_argument("--out", type=Path, default=IMAGES)
    parser.add_argument("--figures-only", action="store_true", help="only the benchmark figures, no report")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("error: Chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        args.out.mkdir(parents=True, exist_ok=True)
        benchmark_figures(work, args.out, chromium)
        if args.figures_only:
            return 0
        storage, name = args.storage, args.study_name
        if storage is None:
            storage, name = f"sqlite:///{work / 'nas.db'}", "prism-tiny"
            nas("search", "--space", "prism", "--preset", "tiny", "--layers", "6", "--trials", "40", "--storage",
                storage, "--study-name", name, cwd=work)
        report = work / "report.html"
        nas("report", "--storage", storage, *(["--study-name", name] if name else []), "-o", str(report), cwd=work)
        args.out.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
            page.goto(report.as_uri())
            page.wait_for_timeout(1500)  # plotly draws after load
            page.screenshot(path=str(args.out / "report-summary.png"))
            for section in SECTIONS:
                element = page.query_selector(f"section#{section}")
                if element is not None:
                    element.screenshot(path=str(args.out / f"report-{section}.png"))
            browser.close()
    print(f"wrote {', '.join(sorted(p.name for p in args.out.glob('report-*.png')))} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
