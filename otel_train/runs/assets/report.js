// otel-train run report: draws the page from the JSON in #report-data with uPlot
// (bundled in this file, no network). window.otelTrainReport holds the data and the
// uPlot instances, for whoever wants to check what was plotted.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var report = { data: data, charts: {} };
  window.otelTrainReport = report;
  var COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function fmt(v, unit) {
    if (v === null || v === undefined || isNaN(v)) return "-";
    if (unit === "s") return v >= 1 ? v.toFixed(2) + " s" : v >= 1e-3 ? (v * 1e3).toFixed(2) + " ms" : (v * 1e6).toFixed(1) + " us";
    if (unit === "B") { var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0; while (v >= 1024 && i < 4) { v /= 1024; i++; } return v.toFixed(1) + " " + u[i]; }
    if (unit === "1") return Math.abs(v) >= 0.01 || v === 0 ? (100 * v).toFixed(1) + "%" : (100 * v).toPrecision(2) + "%";
    return Math.abs(v) >= 1000 ? v.toFixed(0) : v.toPrecision(4);
  }
  function stack(values) {  // cumulative sums, bottom series first
    var out = [], acc = values.length ? values[0].map(function () { return 0; }) : [];
    values.forEach(function (col) {
      acc = acc.map(function (a, i) { return a + (col[i] || 0); });
      out.push(acc.slice());
    });
    return out;
  }
  function chart(spec, parent) {
    var box = el("section", { "class": "chart", id: "chart-" + spec.id });
    box.appendChild(el("h3", {}, spec.title));
    parent.appendChild(box);
    var values = spec.series.map(function (s) { return s.values; });
    var order = spec.series.map(function (s, i) { return i; });
    var plotted = values;
    if (spec.stacked) {  // cumulative, drawn top first so each lower area paints over it
      var cumulative = stack(values);
      order.reverse();
      plotted = order.map(function (i) { return cumulative[i]; });
    }
    var series = [{}];
    var bands = [];
    order.forEach(function (i) {
      var s = spec.series[i];
      var color = COLORS[i % COLORS.length];
      var one = { label: s.label, stroke: color,
                  value: function (u, v, si, di) { return fmt(di === null ? v : values[i][di], spec.unit); } };
      if (spec.points.indexOf(s.label) >= 0) {
        one.paths = function () { return null; };
        one.points = { show: true, size: 8, fill: color };
      } else if (spec.stacked) {
        one.fill = color + "aa";
      }
      series.push(one);
    });
    if (spec.id === "step" && spec.series.length > 1) bands.push({ series: [2, 1], fill: "#1f77b433" });
    var opts = {
      width: Math.min(1100, window.innerWidth - 40), height: 260, series: series,
      bands: bands.length ? bands : undefined,
      axes: [{}, { values: function (u, ticks) { return ticks.map(function (t) { return fmt(t, spec.unit); }); }, size: 70 }],
      scales: { x: { time: true } },
    };
    report.charts[spec.id] = new uPlot(opts, [spec.x].concat(plotted), box);
    report.charts[spec.id].plotted = values;
  }
  function heatmap(h, parent) {
    if (!h.ranks.length || !h.x.length) return;
    var box = el("section", { "class": "chart", id: "heatmap" });
    box.appendChild(el("h3", {}, "Step time per rank (mean per bin; darker is slower)"));
    var all = [].concat.apply([], h.values).filter(function (v) { return v !== null; });
    var lo = Math.min.apply(null, all), hi = Math.max.apply(null, all);
    var table = el("table", { "class": "heat" });
    h.values.forEach(function (row, r) {
      var tr = el("tr");
      tr.appendChild(el("th", {}, "rank " + h.ranks[r]));
      row.forEach(function (v, i) {
        var td = el("td");
        if (v !== null) {
          var k = hi > lo ? (v - lo) / (hi - lo) : 0;
          td.style.background = "rgba(214,39,40," + (0.1 + 0.9 * k).toFixed(3) + ")";
          td.title = "rank " + h.ranks[r] + ", " + new Date(h.x[i] * 1000).toISOString() + ": " + fmt(v, "s");
        }
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
    box.appendChild(table);
    parent.appendChild(box);
  }
  function rows(parent, title, header, lines) {
    var box = el("section", { "class": "table" });
    box.appendChild(el("h3", {}, title));
    var table = el("table");
    var tr = el("tr");
    header.forEach(function (h) { tr.appendChild(el("th", {}, h)); });
    table.appendChild(tr);
    lines.forEach(function (line) {
      var row = el("tr");
      line.forEach(function (v) { row.appendChild(el("td", {}, v)); });
      table.appendChild(row);
    });
    box.appendChild(table);
    parent.appendChild(box);
  }
  function waterfall(w, parent) {
    var box = el("div", { "class": "waterfall" });
    var head = "rank " + w.rank + " step " + w.index + ": " + fmt(w.duration_s, "s") +
      (w.device_ms !== null ? " (device " + fmt(w.device_ms / 1e3, "s") + ")" : "") +
      (w.because ? " [" + w.because + "]" : "") + (w.error ? " ERROR" : "");
    box.appendChild(el("h4", { title: JSON.stringify(w.attributes, null, 1) }, head));
    var total = Math.max(w.duration_s * 1e3, 1e-6);
    w.phases.forEach(function (p) {
      var line = el("div", { "class": "wf-row" });
      line.appendChild(el("span", { "class": "wf-name" }, "\u00a0".repeat(2 * p.depth) + p.name));
      var lane = el("span", { "class": "wf-lane" });
      var bar = el("span", { "class": "wf-bar", title: JSON.stringify(p.attributes, null, 1) });
      bar.style.left = (100 * p.start_ms / total).toFixed(3) + "%";
      bar.style.width = Math.max(0.2, 100 * p.host_ms / total).toFixed(3) + "%";
      lane.appendChild(bar);
      if (p.device_ms !== null) {
        var dev = el("span", { "class": "wf-bar wf-device", title: "device " + fmt(p.device_ms / 1e3, "s") });
        dev.style.left = bar.style.left;
        dev.style.width = Math.max(0.2, 100 * p.device_ms / total).toFixed(3) + "%";
        lane.appendChild(dev);
      }
      line.appendChild(lane);
      line.appendChild(el("span", { "class": "wf-time" }, fmt(p.host_ms / 1e3, "s") +
        (p.device_ms !== null ? " / dev " + fmt(p.device_ms / 1e3, "s") : "")));
      box.appendChild(line);
    });
    parent.appendChild(box);
  }

  var root = document.getElementById("report");
  data.charts.forEach(function (spec) { chart(spec, root); });
  heatmap(data.heatmap, root);
  var s = data.stragglers;
  if (s.scores.length > 1) {
    rows(root, "Straggler score per rank (mean step / median of ranks)" +
      (s.slowest !== null ? ": slowest rank " + s.slowest : ""), ["rank", "mean step", "score"],
      s.scores.map(function (r) { return [String(r.rank), fmt(r.mean_step_s, "s"), r.score === null ? "-" : r.score.toFixed(3)]; }));
  }
  var g = Object.keys(data.goodput);
  if (g.length) rows(root, "Goodput split of run time", ["category", "share"],
    g.map(function (k) { return [k, fmt(data.goodput[k], "1")]; }));
  var sum = el("section", { "class": "table" });
  sum.appendChild(el("h3", {}, "Run summary"));
  sum.appendChild(el("pre", { id: "summary" }, data.summary));
  root.appendChild(sum);
  var wf = el("section", { id: "waterfalls" });
  wf.appendChild(el("h3", {}, "Traced steps (" + data.waterfalls.length + "): phase spans, host time" +
    " (device time beside it where there is a GPU); hover for attributes"));
  data.waterfalls.forEach(function (w) { waterfall(w, wf); });
  root.appendChild(wf);
  report.ready = true;
})();
