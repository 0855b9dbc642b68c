/** A time-series line chart (uPlot, loaded on demand) with a text summary for screen readers. */
import { useEffect, useMemo, useRef } from "react";
import type uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import type { SeriesPoint } from "../api/types";
import { formatNumber } from "../format";
import { loadUPlot } from "./uplotLoader";

export interface ChartSeries {
  label: string;
  points: SeriesPoint[];
}

const PALETTE = ["#3b5bdb", "#e8590c", "#2b8a3e", "#ae3ec9", "#c92a2a", "#1098ad"];

/** Joins series on their x values (steps), as uPlot wants: [xs, ys1, ys2, ...]. */
export function alignSeries(series: ChartSeries[]): (number | null)[][] {
  const xs = Array.from(new Set(series.flatMap((s) => s.points.map(([x]) => x)))).sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const columns = series.map((s) => {
    const ys: (number | null)[] = new Array(xs.length).fill(null);
    for (const [x, y] of s.points) ys[index.get(x)!] = Number.isFinite(y) ? y : null;
    return ys;
  });
  return [xs, ...columns];
}

export function LineChart({
  title,
  series,
  yLabel,
  formatValue = (v: number) => formatNumber(v),
  height = 220,
}: {
  title: string;
  series: ChartSeries[];
  yLabel?: string;
  formatValue?: (value: number) => string;
  height?: number;
}) {
  const holder = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const data = useMemo(() => alignSeries(series), [series]);
  const labels = series.map((s) => s.label).join("|");
  const hasPoints = data[0].length > 0;

  // Create the chart when the set of series changes; later points only update its data.
  useEffect(() => {
    if (!hasPoints) return;
    let cancelled = false;
    let resizeObserver: ResizeObserver | undefined;
    void loadUPlot().then((UPlot) => {
      const el = holder.current;
      if (cancelled || !el) return;
      const width = Math.max(el.clientWidth || 0, 280);
      const opts: uPlot.Options = {
        width,
        height,
        legend: { show: true },
        scales: { x: { time: false } },
        axes: [
          { label: "step", stroke: "currentColor", grid: { stroke: "rgba(128,128,128,0.2)" } },
          {
            label: yLabel,
            stroke: "currentColor",
            grid: { stroke: "rgba(128,128,128,0.2)" },
            values: (_u, splits) => splits.map((v) => formatValue(v)),
            size: 70,
          },
        ],
        series: [
          { label: "step" },
          ...series.map((s, i) => ({
            label: s.label,
            stroke: PALETTE[i % PALETTE.length],
            width: 2,
            spanGaps: true,
            value: (_u: uPlot, v: number | null) => (v === null ? "—" : formatValue(v)),
          })),
        ],
      };
      plot.current = new UPlot(opts, data as uPlot.AlignedData, el);
      if (typeof ResizeObserver !== "undefined") {
        resizeObserver = new ResizeObserver(() => {
          const w = Math.max(el.clientWidth, 280);
          plot.current?.setSize({ width: w, height });
        });
        resizeObserver.observe(el);
      }
    });
    return () => {
      cancelled = true;
      resizeObserver?.disconnect();
      plot.current?.destroy();
      plot.current = null;
    };
  }, [labels, height, hasPoints]);

  useEffect(() => {
    plot.current?.setData(data as uPlot.AlignedData);
  }, [data]);

  const summary = series
    .map((s) => {
      const last = s.points[s.points.length - 1];
      return last ? `${s.label} ${formatValue(last[1])} at step ${last[0]}` : `${s.label}: no data`;
    })
    .join("; ");

  return (
    <figure className="chart" aria-label={title}>
      <figcaption>
        <span className="chart-title">{title}</span>
        <span className="muted small chart-summary">{hasPoints ? `Latest: ${summary}` : "No data yet"}</span>
      </figcaption>
      {hasPoints ? <div ref={holder} className="chart-canvas" /> : <div className="chart-empty muted">Waiting for the first measurements…</div>}
    </figure>
  );
}
