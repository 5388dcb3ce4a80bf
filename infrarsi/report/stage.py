"""The report stage: gather a run's evidence, draw the plots, write report.md and report.html."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from infrarsi.report import _doc as D
from infrarsi.report import _sections as S
from infrarsi.report._data import ReportData, load_report_data
from infrarsi.report._plots import PLOTS, render_all
from infrarsi.rundir import REPORT_DIR, resolve_run_dir


@dataclass(frozen=True)
class ReportResult:
    """Where the report went (``markdown``, ``html``, ``plots`` by name), the evidence it was
    drawn from (``data``), and the short ``summary`` printed at the end of the stage."""

    data: ReportData
    markdown: Path
    html: Path
    plots: dict[str, Path] = field(default_factory=dict)
    summary: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = self.data
        return {"run_id": d.run_id, "run_dir": str(d.run_dir), "task": d.task_name,
                "markdown": str(self.markdown), "html": str(self.html),
                "plots": {k: str(v) for k, v in self.plots.items()},
                "promoted": d.promoted, "not_promoted": d.not_promoted, "partial": d.partial,
                "summary": self.summary}


def build_report(run_dir: str | Path | None = None, *, out_dir: str | Path | None = None,
                 bank_url: str | None = None) -> ReportResult:
    """Write ``report.md``, ``report.html`` (self-contained) and ``plots/*.png`` for a run.

    ``run_dir`` defaults to the last ``infrarsi init``; ``out_dir`` to ``RUN/report``. Works on
    a finished run, on a run still in progress (marked partial) and on a run that promoted
    nothing (the report says why). Raises :class:`ReportInputError` when there is no run.
    """
    run_dir = Path(run_dir) if run_dir else resolve_run_dir(None)
    data = load_report_data(run_dir, bank_url=bank_url)
    out = Path(out_dir) if out_dir else Path(run_dir) / REPORT_DIR
    (out / "plots").mkdir(parents=True, exist_ok=True)
    plots = render_all(data)
    written = {}
    for name, (_, png, _) in plots.items():
        path = out / "plots" / f"{name}.png"
        if png is not None:
            path.write_bytes(png)
            written[name] = path
        elif path.exists():
            path.unlink()  # a stale plot from an earlier report must not pass for this one
    blocks = S.build(data, plots)
    title = f"InfraRSI report — {data.task_name}" + (" (partial)" if data.partial else "")
    md, html = out / "report.md", out / "report.html"
    md.write_text(D.to_markdown(title, blocks))
    html.write_text(D.to_html(title, blocks))
    result = ReportResult(data, md, html, written)
    return replace(result, summary=summary(result))


def summary(result: ReportResult) -> str:
    """A few lines for the terminal, ending with the path of report.html."""
    d = result.data
    _, line = S.verdict_line(d)
    lines = [line.replace("**", "")]
    b, a = d.before, d.after
    if b and a and b.step_s and a.step_s:
        lines.append(f"step time {b.step_s * 1e3:,.1f} ms -> {a.step_s * 1e3:,.1f} ms; "
                     f"tokens/s {b.tokens_per_s or 0:,.0f} -> {a.tokens_per_s or 0:,.0f}"
                     + (f"; MFU {b.mfu:.2%} -> {a.mfu:.2%}" if b.mfu and a.mfu else "")
                     + (f"; peak memory {b.peak_bytes / 2**20:,.0f} -> {a.peak_bytes / 2**20:,.0f} MiB"
                        if b.peak_bytes and a.peak_bytes else ""))
    changed = d.changed(d.winner_config)
    if changed:
        lines.append("promoted change: " + ", ".join(f"{k}: {x} -> {y}" for k, (x, y) in sorted(changed.items())))
    failed = [r for r in d.records if not r.ok]
    total = sum(r.device_seconds for r in d.records)
    lines.append(f"{len(d.records)} trials, {total:,.0f} device-s "
                 f"({sum(r.device_seconds for r in failed):,.0f} on {len(failed)} failed)")
    missing = [n for n in PLOTS if n not in result.plots]
    if missing:
        lines.append(f"plots not drawn: {', '.join(missing)} (the report says why)")
    lines.append(f"report: {result.html.resolve()}")
    return "\n".join(lines)

