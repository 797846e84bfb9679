/* kbench history pages: draws the series embedded in the page (script#kbench-data) with plotly.js.
   No network: plotly.min.js is copied beside this file by `kbench publish`. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("kbench-data").textContent);
  var chartsEl = document.getElementById("charts");
  var detailsEl = document.getElementById("details");
  var filtersEl = document.getElementById("filters");
  var lineage = data.kind === "lineage";
  var BAND = "rgba(31,119,180,0.18)", LINE = "#1f77b4";
  var PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];

  function fmtTime(s) {
    if (s >= 1) return s.toPrecision(3) + " s";
    if (s >= 1e-3) return (s * 1e3).toPrecision(3) + " ms";
    if (s >= 1e-6) return (s * 1e6).toPrecision(3) + " us";
    return (s * 1e9).toPrecision(3) + " ns";
  }
  function fmtY(v) { return lineage ? v.toPrecision(4) + " TFLOP/s" : fmtTime(v); }
  /* the x axis of a history is the runs in commit order (one position per run), labelled by commit */
  function xOf(i) { return i; }
  function tickLabel(i) {
    var r = data.runs[i];
    var head = r.commit ? r.commit.slice(0, 7) + (r.dirty ? "*" : "") : r.id.slice(0, 12);
    return head + "<br>" + r.time.slice(5, 10);
  }
  /* about eight labelled runs across what is in view (each a whole run: no tick between two runs) */
  function runTicks(lo, hi) {
    var first = Math.max(0, Math.ceil(lo)), last = Math.min(data.runs.length - 1, Math.floor(hi));
    var step = Math.max(1, Math.ceil((last - first + 1) / 8)), vals = [];
    for (var i = first; i <= last; i += step) vals.push(i);
    return {tickvals: vals, ticktext: vals.map(tickLabel)};
  }
  function axisTicks(lo, hi) {
    var t = runTicks(lo, hi);
    return {"xaxis.tickvals": t.tickvals, "xaxis.ticktext": t.ticktext};
  }
  function esc(t) { var d = document.createElement("span"); d.textContent = String(t); return d.innerHTML; }
  function link(href, text) { return href ? '<a href="' + esc(href) + '">' + esc(text) + "</a>" : esc(text); }

  function describeRun(i) {
    var r = data.runs[i];
    var commit = r.commit ? r.commit.slice(0, 12) + (r.dirty ? "-dirty" : "") : "no commit";
    return "run " + link(r.file, r.id) + " \u00b7 machine " + esc(r.machine) + " \u00b7 suite " + esc(r.suite) +
      " \u00b7 commit " + link(r.commit_url, commit) + " \u00b7 " + esc(r.by_commit_date ? "commit date " : "run time ") +
      esc(r.time) + " \u00b7 ran " + esc(r.created);
  }
  function describeVersion(n) {
    var v = data.versions.filter(function (x) { return x.number === n; })[0];
    return v ? esc(v.label + " \u00b7 " + v.operator + " \u00b7 committed " + v.committed + " \u00b7 geomean " +
      v.geomean.toPrecision(4) + " TFLOP/s \u00b7 " + v.rationale) : "";
  }

  /* ---- filters: one select per parameter with more than one value ---- */
  var state = {};
  function valuesOf(get) {
    var seen = {};
    data.series.forEach(function (s) { var v = get(s); if (v !== undefined && v !== null) seen[String(v)] = 1; });
    return Object.keys(seen).sort();
  }
  var filterDefs = [];
  if (!lineage) {
    filterDefs.push(["op", function (s) { return s.op; }]);
    filterDefs.push(["backend", function (s) { return s.backend; }]);
    ["dtype", "head_dim", "causal"].forEach(function (p) {
      filterDefs.push([p, function (s) { return s.params ? s.params[p] : undefined; }]);
    });
    if (data.mixed) {
      var machines = {};
      data.runs.forEach(function (r) { machines[r.machine] = 1; });
      filterDefs.push(["machine", null, Object.keys(machines).sort()]);
    }
  }
  function buildFilters() {
    if (!filtersEl) return;
    filterDefs.forEach(function (def) {
      var values = def[2] || valuesOf(def[1]);
      if (values.length < 2) return;
      var label = document.createElement("label");
      label.textContent = def[0] + " ";
      var sel = document.createElement("select");
      sel.name = def[0];
      ["(all)"].concat(values).forEach(function (v) {
        var o = document.createElement("option"); o.value = v; o.textContent = v; sel.appendChild(o);
      });
      sel.addEventListener("change", function () { state[def[0]] = sel.value === "(all)" ? null : sel.value; render(); });
      label.appendChild(sel);
      filtersEl.appendChild(label);
    });
    var count = document.createElement("span");
    count.id = "shown-count";
    filtersEl.appendChild(count);
  }
  function visible(s) {
    return filterDefs.every(function (def) {
      var want = state[def[0]];
      if (!want || !def[1]) return true;
      return String(def[1](s)) === want;
    });
  }

  /* ---- one chart ---- */
  function traces(s) {
    /* points set aside as outliers get their own markers below; the line and band join the others */
    var aside = {};
    (s.outliers || []).forEach(function (r) { aside[r] = 1; });
    var idx = s.x.map(function (_, k) { return k; }).filter(function (k) { return !aside[s.x[k]]; });
    if (state.machine) idx = idx.filter(function (k) { return data.runs[s.x[k]].machine === state.machine; });
    var xs = idx.map(function (k) { return xOf(s.x[k]); });
    var out = [];
    if (s.lo && s.hi) {
      out.push({x: xs, y: idx.map(function (k) { return s.hi[k]; }), mode: "lines", line: {width: 0},
                hoverinfo: "skip", showlegend: false});
      out.push({x: xs, y: idx.map(function (k) { return s.lo[k]; }), mode: "lines", line: {width: 0},
                fill: "tonexty", fillcolor: BAND, hoverinfo: "skip", name: "95% CI"});
    }
    var colors = LINE;
    if (data.mixed) {
      var ms = {}, n = 0;
      data.runs.forEach(function (r) { if (!(r.machine in ms)) ms[r.machine] = PALETTE[n++ % PALETTE.length]; });
      colors = idx.map(function (k) { return ms[data.runs[s.x[k]].machine]; });
    }
    out.push({x: xs, y: idx.map(function (k) { return s.m[k]; }), customdata: idx.map(function (k) { return s.x[k]; }),
              mode: "lines+markers", line: {color: LINE, width: 1.5}, marker: {size: 6, color: colors},
              name: lineage ? "TFLOP/s" : "median",
              text: idx.map(function (k) {
                var label = lineage ? "v" + s.x[k] : data.runs[s.x[k]].id + " " + (data.runs[s.x[k]].commit || "").slice(0, 10);
                return label + "<br>" + fmtY(s.m[k]) + (s.n ? " (n=" + s.n[k] + ")" : "");
              }), hoverinfo: "text"});
    if (s.levels && !state.machine) {
      var lx = [], ly = [];
      s.levels.forEach(function (l) { lx.push(xOf(l[0]), xOf(l[1]), null); ly.push(l[2], l[2], null); });
      out.push({x: lx, y: ly, mode: "lines", line: {color: "#555", dash: "dash", width: 1}, name: "fitted level",
                hoverinfo: "skip"});
    }
    var yr = yRange(s);
    if (s.outliers && s.outliers.length) {
      /* outliers beyond the axis (slow windows of the machine) sit on its top edge as triangles */
      out.push({x: s.outliers.map(xOf), y: s.outliers.map(function (r) { return Math.min(s.m[s.x.indexOf(r)], yr[1]); }),
                mode: "markers", marker: {symbol: s.outliers.map(function (r) {
                  return s.m[s.x.indexOf(r)] > yr[1] ? "triangle-up-open" : "x-open"; }), size: 11, color: "#999"},
                text: s.outliers.map(function (r) { return "outlier, set aside: " + fmtY(s.m[s.x.indexOf(r)]); }),
                customdata: s.outliers, hoverinfo: "text", name: "outlier", cliponaxis: false});
    }
    if (s.unconfirmed) {
      out.push({x: [xOf(s.unconfirmed.run)], y: [s.m[s.x.indexOf(s.unconfirmed.run)]], mode: "markers",
                marker: {symbol: "circle-open", size: 14, color: "#ff7f0e"},
                name: "unconfirmed " + (100 * s.unconfirmed.size).toFixed(1) + "%", hoverinfo: "name"});
    }
    if (data.env && data.env.length) {
      var top = yr[1];
      out.push({x: data.env.map(function (e) { return xOf(e.run); }), y: data.env.map(function () { return top; }),
                mode: "markers", marker: {symbol: "diamond", size: 9, color: "#7f7f7f"}, name: "environment change", cliponaxis: false,
                text: data.env.map(function (e) { return e.text; }), hoverinfo: "text"});
    }
    return out;
  }
  /* the axis follows the points that were not set aside, so one slow window does not flatten the rest */
  function yRange(s) {
    var out = {};
    (s.outliers || []).forEach(function (r) { out[r] = 1; });
    var ms = [], his = [], los = [];
    s.x.forEach(function (r, k) {
      if (out[r]) return;
      ms.push(s.m[k]); if (s.hi) { his.push(s.hi[k]); los.push(s.lo[k]); }
    });
    if (!ms.length) ms = s.m.slice();
    his.sort(function (a, b) { return a - b; });
    var hi = Math.max(Math.max.apply(null, ms), his.length ? his[Math.floor(0.9 * (his.length - 1))] : 0);
    var lo = Math.min(Math.min.apply(null, ms), los.length ? Math.min.apply(null, los) : Infinity);
    var pad = 0.08 * (hi - lo || hi * 0.05);
    return [lo - pad, hi + pad];
  }
  function layout(s) {
    var shapes = [], annotations = [];
    (data.env || []).forEach(function (e) {
      shapes.push({type: "line", xref: "x", yref: "paper", x0: xOf(e.run), x1: xOf(e.run), y0: 0, y1: 1,
                   line: {color: "#7f7f7f", width: 1, dash: "dot"}});
    });
    (s.steps || []).forEach(function (st) {
      var slower = st.size > 0;
      var color = st.undone ? "#7f7f7f" : slower ? "#d62728" : "#2ca02c";
      shapes.push({type: "rect", xref: "x", yref: "paper", x0: xOf(st.before), x1: xOf(st.after), y0: 0, y1: 1,
                   fillcolor: st.undone ? "rgba(127,127,127,0.12)" : slower ? "rgba(214,39,40,0.15)" : "rgba(44,160,44,0.15)",
                   line: {width: 0}});
      /* inside the plot, at the top of the shaded range: the toolbar sits above the plot's top right */
      annotations.push({x: xOf(st.after), y: 0.98, xref: "x", yref: "paper", showarrow: false, yanchor: "top",
                        xanchor: "left", bgcolor: "rgba(255,255,255,0.8)",
                        text: (st.undone ? "undone " : "") + (slower ? "slower +" : "faster ") +
                              (100 * st.size).toFixed(1) + "%", font: {color: color, size: 11}});
    });
    var xaxis = lineage ? {title: {text: "version"}, dtick: 1}
      : Object.assign({title: {text: "runs in commit order (commit date; run time where unknown)"},
                       tickmode: "array", range: [-0.5, data.runs.length - 0.5], zeroline: false},
                      runTicks(0, data.runs.length - 1));
    return {height: 320, margin: {l: 70, r: 20, t: 30, b: 60}, showlegend: false, shapes: shapes,
            annotations: annotations, hovermode: "closest", xaxis: xaxis,
            /* SI prefixes carry their unit: 60 ms reads "60ms", never "60m" (which reads as minutes) */
            yaxis: lineage ? {title: {text: "TFLOP/s"}, tickformat: "~s", range: yRange(s)}
              : {title: {text: "median time"}, tickformat: "~s", ticksuffix: "s", range: yRange(s)}};
  }
  function draw(div, s) {
    Plotly.newPlot(div, traces(s), layout(s), {displaylogo: false, responsive: true}).then(function () {
      div.setAttribute("data-rendered", "1");
    });
    if (!lineage) {
      /* zoomed or panned: label the runs now in view */
      div.on("plotly_relayout", function (ev) {
        if (ev["xaxis.range[0]"] !== undefined) {
          Plotly.relayout(div, axisTicks(ev["xaxis.range[0]"], ev["xaxis.range[1]"]));
        } else if (ev["xaxis.autorange"]) {
          Plotly.relayout(div, Object.assign({"xaxis.range": [-0.5, data.runs.length - 0.5]},
                                             axisTicks(0, data.runs.length - 1)));
        }
      });
    }
    div.on("plotly_click", function (ev) {
      var p = ev.points && ev.points[0];
      if (!p || p.customdata === undefined || !detailsEl) return;
      detailsEl.innerHTML = "<b>" + esc(s.backend + " \u00b7 " + s.case) + "</b>: " +
        (lineage ? describeVersion(p.customdata) : describeRun(p.customdata)) + " \u00b7 " + esc(fmtY(p.y));
    });
  }

  /* ---- all charts, drawn when they come into view ---- */
  var observer = "IntersectionObserver" in window ? new IntersectionObserver(function (entries) {
    entries.forEach(function (e) {
      if (e.isIntersecting && !e.target.getAttribute("data-drawn")) {
        e.target.setAttribute("data-drawn", "1");
        observer.unobserve(e.target);
        draw(e.target.querySelector(".plot"), e.target.kbenchSeries);
      }
    });
  }, {rootMargin: "400px"}) : null;

  function render() {
    if (observer) observer.disconnect();
    chartsEl.innerHTML = "";
    var shown = data.series.filter(visible);
    var count = document.getElementById("shown-count");
    if (count) count.textContent = shown.length + " of " + data.series.length + " series";
    shown.forEach(function (s) {
      var box = document.createElement("section");
      box.className = "chart";
      var steps = (s.steps || []).map(function (st) {
        return (st.undone ? "undone " : "") + (st.size > 0 ? "slower +" : "faster ") + (100 * st.size).toFixed(1) + "%";
      }).join(", ");
      box.innerHTML = "<h3>" + esc(s.backend) + " \u00b7 " + esc(s.case) + "</h3>" +
        (steps ? '<p class="steps">steps: ' + esc(steps) + "</p>" : "") + '<div class="plot"></div>';
      box.kbenchSeries = s;
      chartsEl.appendChild(box);
      if (observer) observer.observe(box); else draw(box.querySelector(".plot"), s);
    });
  }
  buildFilters();
  render();
})();
