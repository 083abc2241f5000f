// Queen dashboard charts: time series drawn by uPlot (vendor/uplot, MIT), with axes,
// a time scale and a tooltip legend. Plain browser JavaScript, no build step.
(() => {
  "use strict";

  const Q = window.Queen;
  const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  const compact = (v) => {
    if (v == null) return "–";
    const a = Math.abs(v);
    if (a >= 1e6) return `${+(v / 1e6).toFixed(1)}M`;
    if (a >= 1e3) return `${+(v / 1e3).toFixed(1)}k`;
    return `${+v.toFixed(2)}`;
  };

  // A line chart in `box` of series [{label, color: css var, key}] over points [{t: ms, ...}].
  // Calling it again with the same box replaces the data (and the size, if the box changed).
  Q.timeChart = (box, series, points, { height = 180, unit = "" } = {}) => {
    const data = [points.map((p) => p.t / 1000), ...series.map((s) => points.map((p) => p[s.key]))];
    const width = Math.max(200, box.clientWidth);
    const existing = box._chart;
    if (existing && existing._series === series.map((s) => s.key).join()) {
      if (existing.width !== width) existing.setSize({ width, height });
      existing.setData(data);
      return existing;
    }
    if (existing) existing.destroy();
    const chart = new uPlot({
      width,
      height,
      cursor: { drag: { x: false, y: false } },
      scales: { y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
      axes: [
        { stroke: css("--muted"), grid: { stroke: css("--line") }, ticks: { stroke: css("--line") } },
        {
          stroke: css("--muted"),
          grid: { stroke: css("--line") },
          ticks: { stroke: css("--line") },
          size: 50,
          values: (u, ticks) => ticks.map(compact),
        },
      ],
      series: [
        { value: (u, v) => (v == null ? "–" : new Date(v * 1000).toTimeString().slice(0, 5)) },
        ...series.map((s) => ({
          label: s.label,
          stroke: css(s.color),
          width: 1.6,
          points: { show: false },
          value: (u, v) => (v == null ? "–" : `${compact(v)}${unit}`),
        })),
      ],
    }, data, box);
    chart._series = series.map((s) => s.key).join();
    box._chart = chart;
    return chart;
  };

  // A small chart without axes or legend (a table cell's trend).
  Q.sparkChart = (box, series, points, { width = 120, height = 28 } = {}) => {
    const data = [points.map((p) => p.t / 1000), ...series.map((s) => points.map((p) => p[s.key]))];
    if (box._chart) {
      box._chart.setData(data);
      return box._chart;
    }
    const chart = new uPlot({
      width,
      height,
      legend: { show: false },
      cursor: { show: false },
      scales: { y: { range: (u, min, max) => [0, Math.max(1, max)] } },
      axes: [{ show: false }, { show: false }],
      series: [{}, ...series.map((s) => ({ stroke: css(s.color), width: 1.4, points: { show: false } }))],
    }, data, box);
    box._chart = chart;
    return chart;
  };
})();
