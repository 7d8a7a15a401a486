// otel-train run report: the charts. window.otelTrainCharts.draw(spec, parent) draws one
// chart spec of the page data (charts.py): a uPlot chart when a series has at least
// MIN_POINTS points, else the run's figures as bars. Each unit of a chart has its own
// axis; tick labels carry as many decimals as the ticks need (no two alike) and each
// axis is as wide as its longest label.
(function () {
  "use strict";
  var COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  var MIN_POINTS = 3;
  var SCALES = {  // [divisor, suffix], largest first
    "s": [[1, " s"], [1e-3, " ms"], [1e-6, " us"], [1e-9, " ns"]],
    "B": [[Math.pow(1024, 4), " TiB"], [Math.pow(1024, 3), " GiB"], [1048576, " MiB"], [1024, " KiB"], [1, " B"]],
    "1": [[0.01, "%"]],
    "": [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"], [1, ""]],
  };

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function scaleOf(unit, top) {
    var list = SCALES[unit] || SCALES[""], over = SCALES[unit] ? 1 : 10;  // 1500, 15k
    if (!(top > 0)) return unit === "s" ? list[0] : list[list.length - 1];  // 0 s, 0 B, 0
    for (var i = 0; i < list.length; i++) if (top >= over * list[i][0]) return list[i];
    return list[list.length - 1];
  }
  function fmt(v, unit) {  // one value: four significant digits in the unit's scale
    if (v === null || v === undefined || isNaN(v)) return "-";
    var sc = scaleOf(unit, Math.abs(v)), x = v / sc[0];
    var text = Math.abs(x) >= 1000 ? x.toFixed(0) : Number(x.toPrecision(4)).toString();
    return text + sc[1] + (SCALES[unit] || !unit ? "" : " " + unit);
  }
  function ticks(splits, unit) {  // the labels of an axis's ticks
    var top = Math.max.apply(null, splits.map(Math.abs).concat([0]));
    var sc = scaleOf(unit, top), xs = splits.map(function (v) { return v / sc[0]; });
    var step = Infinity;
    for (var i = 1; i < xs.length; i++) if (xs[i] > xs[i - 1]) step = Math.min(step, xs[i] - xs[i - 1]);
    var tol = isFinite(step) ? step * 1e-3 : 1e-9;
    function at(d) {
      return xs.map(function (x) {
        if (Math.abs(x) < tol) return sc[1].charAt(0) === " " || sc[1] === "%" ? (0).toFixed(d) + sc[1] : "0";
        return x.toFixed(d) + sc[1];
      });
    }
    var d = 0;
    while (d < 12 && !xs.every(function (x) { return Math.abs(Number(x.toFixed(d)) - x) <= tol; })) d++;
    var labels = at(d);
    while (d < 15 && new Set(labels).size < labels.length) labels = at(++d);
    return labels;
  }
  function axisSize(u, values, i, cycle) {  // room for the widest label, ticks and gap
    var axis = u.axes[i];
    u.ctx.font = axis.font[0];
    var widest = (values || []).reduce(function (w, v) {
      return Math.max(w, u.ctx.measureText(v).width / devicePixelRatio);
    }, 0);
    var size = Math.ceil(widest + axis.ticks.size + axis.gap + 2);
    // Within one layout (cycles 1, 2, ...) never narrower than before: it converges, and
    // whatever labels the last cycle draws fit.
    return cycle > 0 && axis._size > size ? axis._size : size;
  }
  function stack(values) {  // cumulative sums, bottom series first; null where all are
    var acc = values.length ? values[0].map(function () { return 0; }) : [];
    return values.map(function (col) {
      acc = acc.map(function (a, i) { return a + (col[i] || 0); });
      return acc.map(function (a, i) {
        return values.every(function (c) { return c[i] === null; }) ? null : a;
      });
    });
  }
  function points(spec) {  // the most points a curve (not a marker series) has
    return spec.series.reduce(function (n, s) {
      if (spec.points.indexOf(s.label) >= 0) return n;
      return Math.max(n, s.values.filter(function (v) { return v !== null; }).length);
    }, 0);
  }
  function figures(spec, box, n) {
    box.appendChild(el("p", { "class": "note" }, (n ? "Only " + n + " point(s) per series" :
      "No series") + ": the run's own figures (from each rank's last snapshot)."));
    var top = {};
    spec.figures.forEach(function (f) { top[f.unit] = Math.max(top[f.unit] || 0, Math.abs(f.value)); });
    spec.figures.forEach(function (f, i) {
      var row = el("div", { "class": "fig-row" });
      row.appendChild(el("span", { "class": "fig-name" }, f.label));
      var lane = el("span", { "class": "fig-lane" }), bar = el("span", { "class": "fig-bar" });
      var full = f.unit === "1" ? 1 : top[f.unit];
      bar.style.width = (full > 0 ? Math.min(100, 100 * Math.abs(f.value) / full) : 0).toFixed(1) + "%";
      bar.style.background = COLORS[i % COLORS.length];
      lane.appendChild(bar);
      row.appendChild(lane);
      row.appendChild(el("span", { "class": "fig-value" }, fmt(f.value, f.unit)));
      box.appendChild(row);
    });
  }
  function plot(spec, box, charts) {
    var values = spec.series.map(function (s) { return s.values; });
    var order = spec.series.map(function (s, i) { return i; });
    var plotted = values;
    if (spec.stacked) {  // cumulative, drawn top first so each lower area paints over it
      var cumulative = stack(values);
      order.reverse();
      plotted = order.map(function (i) { return cumulative[i]; });
    }
    var units = [];
    spec.series.forEach(function (s) { if (units.indexOf(s.unit) < 0) units.push(s.unit); });
    var series = [{}], scales = { x: { time: true } }, axes = [{}];
    units.forEach(function (unit, k) {
      scales["y" + k] = !spec.stacked ? { auto: true } : { auto: true, range: function (u, lo, hi) {
        return [0, unit === "1" ? 1 : hi > 0 ? hi * 1.05 : 1];  // stacked areas stand on zero
      } };
      axes.push({ scale: "y" + k, side: k % 2 ? 1 : 3, grid: { show: k === 0 }, size: axisSize,
                  label: SCALES[unit] ? undefined : unit || undefined,
                  values: function (u, splits) { return ticks(splits, unit); } });
    });
    order.forEach(function (i) {
      var s = spec.series[i], color = COLORS[i % COLORS.length];
      var k = units.indexOf(s.unit);
      var one = { label: s.label, stroke: color, scale: "y" + k, dash: k ? [6, 4] : undefined,
                  value: function (u, v, si, di) { return fmt(di === null ? v : values[i][di], s.unit); } };
      if (spec.points.indexOf(s.label) >= 0) {
        one.paths = function () { return null; };
        one.points = { show: true, size: 8, fill: color };
      } else if (spec.stacked) {
        one.fill = color + "aa";
      }
      series.push(one);
    });
    var opts = {
      width: Math.min(1100, window.innerWidth - 40), height: 260, series: series,
      scales: scales, axes: axes,
      bands: spec.id === "step" && spec.series.length > 1 ? [{ series: [2, 1], fill: "#1f77b433" }] : undefined,
    };
    charts[spec.id] = new uPlot(opts, [spec.x].concat(plotted), box);
    charts[spec.id].plotted = values;
  }
  function draw(spec, parent, report) {
    var box = el("section", { "class": "chart", id: "chart-" + spec.id });
    box.appendChild(el("h3", {}, spec.title));
    parent.appendChild(box);
    var n = points(spec);
    if (n >= MIN_POINTS) {
      plot(spec, box, report.charts);
    } else {
      figures(spec, box, n);
      report.figures[spec.id] = spec.figures;
    }
  }
  window.otelTrainCharts = { draw: draw, fmt: fmt, ticks: ticks, el: el };
})();
