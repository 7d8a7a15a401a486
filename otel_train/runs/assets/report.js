// otel-train run report: draws the page from the JSON in #report-data with uPlot
// (bundled in this file, no network; the charts: charts.js). window.otelTrainReport
// holds the data, the uPlot instances (charts) and the figures shown instead of a
// chart (figures), for whoever wants to check what was drawn.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var report = { data: data, charts: {}, figures: {} };
  window.otelTrainReport = report;
  var C = window.otelTrainCharts, el = C.el, fmt = C.fmt;
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
  function width(start, ms, total) {  // (a generator's rollout may outlast the step)
    var left = 100 * start / total;
    return Math.max(0.2, Math.min(100 * ms / total, 100 - left)).toFixed(3) + "%";
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
      bar.style.width = width(p.start_ms, p.host_ms, total);
      lane.appendChild(bar);
      if (p.device_ms !== null) {
        var dev = el("span", { "class": "wf-bar wf-device", title: "device " + fmt(p.device_ms / 1e3, "s") });
        dev.style.left = bar.style.left;
        dev.style.width = width(p.start_ms, p.device_ms, total);
        lane.appendChild(dev);
      }
      line.appendChild(lane);
      line.appendChild(el("span", { "class": "wf-time" }, fmt(p.host_ms / 1e3, "s") +
        (p.device_ms !== null ? " / dev " + fmt(p.device_ms / 1e3, "s") : "")));
      box.appendChild(line);
    });
    parent.appendChild(box);
  }
  function against(c, parent) {  // otel-train report A --against B (runs/against.py)
    var box = el("section", { "class": "table", id: "against" });
    box.appendChild(el("h3", {}, "Against " + c.b + " (A: " + c.a + ", B: " + c.b + ")"));
    box.appendChild(el("p", { "class": "note" }, c.method));
    var top = Math.max.apply(null, c.rows.map(function (r) { return Math.max(r.a, r.b); }));
    c.rows.forEach(function (r) {
      var line = el("div", { "class": "cmp-row" });
      line.appendChild(el("span", { "class": "fig-name" }, r.name));
      var lane = el("span", { "class": "cmp-lane" });
      ["a", "b"].forEach(function (k) {
        var bar = el("span", { "class": "cmp-bar cmp-" + k, title: k.toUpperCase() + " " + fmt(r[k], "s") });
        bar.style.width = (top > 0 ? 100 * r[k] / top : 0).toFixed(3) + "%";
        lane.appendChild(bar);
      });
      line.appendChild(lane);
      line.appendChild(el("span", { "class": "cmp-value" },
        fmt(r.a, "s") + " \u2192 " + fmt(r.b, "s") + ": " + r.change));
      box.appendChild(line);
    });
    parent.appendChild(box);
  }

  var root = document.getElementById("report");
  if (data.against) against(data.against, root);
  data.charts.forEach(function (spec) { C.draw(spec, root, report); });
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
